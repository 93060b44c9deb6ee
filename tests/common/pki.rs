//! Certificates made at test time (rcgen, never committed).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

pub struct Authority {
    pub cert: rcgen::Certificate,
    pub key: KeyPair,
    pub pem: PathBuf,
}

pub fn authority(dir: &Path, name: &str) -> Authority {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    let pem = dir.join(format!("{name}.pem"));
    std::fs::write(&pem, cert.pem()).expect("write CA");
    Authority { cert, key, pem }
}

/// A certificate for `cn` signed by `ca`: (certificate file, key file),
/// named after `cn`. A server certificate names localhost and 127.0.0.1 in
/// its SANs (no CN) and may also act as a client (etcd's gateway dials etcd
/// with it).
pub fn issue(dir: &Path, ca: &Authority, cn: &str, server: bool) -> (PathBuf, PathBuf) {
    issue_as(dir, ca, cn, server, !server)
}

/// A client certificate with no CN (files named after `stem`): what etcd's
/// JSON gateway takes with client-cert auth on, where the caller is named
/// by its etcd user instead.
pub fn issue_without_cn(dir: &Path, ca: &Authority, stem: &str) -> (PathBuf, PathBuf) {
    issue_as(dir, ca, stem, false, false)
}

fn issue_as(dir: &Path, ca: &Authority, cn: &str, server: bool, with_cn: bool) -> (PathBuf, PathBuf) {
    let names = if server { vec!["localhost".to_string(), "127.0.0.1".to_string()] } else { Vec::new() };
    let mut params = CertificateParams::new(names).expect("params");
    // rcgen's default subject has a CN of its own.
    params.distinguished_name = rcgen::DistinguishedName::new();
    if with_cn {
        params.distinguished_name.push(DnType::CommonName, cn);
    } else {
        params.distinguished_name.push(DnType::OrganizationName, "sluice tests");
    }
    params.extended_key_usages = if server {
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca.cert, &ca.key).expect("sign");
    let (cert_path, key_path) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}
