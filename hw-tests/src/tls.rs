//! TLS material for a rig run: a CA made for the run and a certificate for
//! the storage host's address, written to the shared directory (never
//! committed, gone with the run), so a node listening on the rig's wire
//! serves its control API and data port over TLS as a real deployment must.

use crate::rig::{Host, Rig, RigError};

/// Guest-side paths of the run's CA and the storage node's certificate.
#[derive(Clone, Debug)]
pub struct RigTls {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl RigTls {
    /// `sluiced` flags: HTTPS on the control API, TLS on the data port.
    pub fn sluiced_args(&self) -> String {
        format!("--tls-cert {} --tls-key {} --data-tls", self.cert, self.key)
    }

    /// `sluicectl` flags: trust the run's CA.
    pub fn ctl_args(&self) -> String {
        format!("--ca-file {}", self.ca)
    }
}

fn tls_error(what: &str, err: rcgen::Error) -> RigError {
    RigError::io(what, std::io::Error::other(err.to_string()))
}

impl Rig {
    /// Makes the run's CA and a certificate for the storage host's address.
    pub fn tls(&self) -> Result<RigTls, RigError> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("CA parameters", e))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "sluice rig CA");
        let ca_key = KeyPair::generate().map_err(|e| tls_error("CA key", e))?;
        let ca = ca_params.self_signed(&ca_key).map_err(|e| tls_error("CA certificate", e))?;
        let storage = self.addr(Host::Storage);
        let mut params =
            CertificateParams::new(vec![storage.clone()]).map_err(|e| tls_error("node certificate parameters", e))?;
        params.distinguished_name.push(DnType::CommonName, storage.as_str());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(|e| tls_error("node key", e))?;
        let cert = params.signed_by(&key, &ca, &ca_key).map_err(|e| tls_error("node certificate", e))?;
        Ok(RigTls {
            ca: self.share_file("rig-ca.pem", ca.pem().as_bytes())?,
            cert: self.share_file("node.pem", cert.pem().as_bytes())?,
            key: self.share_file("node.key", key.serialize_pem().as_bytes())?,
        })
    }

    /// Where a node started with [`Rig::start_sluiced`] keeps the operator
    /// token it made at first start (on the storage host).
    pub fn admin_token_file(&self) -> String {
        format!("{}/data/admin.token", self.scratch_dir(Host::Storage))
    }
}
