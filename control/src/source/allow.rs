//! Which sources this node fetches from: its config's `source_allow`.
//!
//! A source URL comes from a record: an operator's create, or in a cluster
//! a record any node may write in etcd. Records are input, not orders (as
//! for the namespaces they name), and a source URL is a request the node
//! makes with its own reach: `file://` reads the node's own files (its TLS
//! key, its admin tokens), `http://169.254.169.254/` answers with the
//! cloud credentials of the machine, `http://127.0.0.1:2379/` is etcd.
//! Whatever a fill fetches, a reader with a grant reads. So the node
//! fetches only from what its own config allows, checked on every fetch,
//! not only at create.
//!
//! By default that is the object stores, reached with the node's own
//! credentials and endpoint (`s3://`, `gs://`, `az://` and Azure's other
//! schemes, any bucket); `http://`, `https://` and `file://` sources must
//! be listed. An entry is a scheme (`s3://`: any URL of it) or a URL
//! prefix (`s3://corpus/tokenized/`, `https://data.example.com/sets/`,
//! `file:///srv/datasets/`): the same scheme, user, host and port, and a
//! path at or under the entry's, compared segment by segment after
//! percent-decoding.

use percent_encoding::percent_decode_str;
use url::Url;

/// Schemes allowed where the config lists none: the object stores.
pub const OBJECT_STORE_SCHEMES: [&str; 7] = ["s3", "s3a", "gs", "az", "azure", "abfs", "abfss"];

/// One entry of `source_allow`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AllowEntry {
    /// Every URL of this scheme.
    Scheme(String),
    /// URLs of this origin at or under this path.
    Prefix { scheme: String, username: String, host: Option<String>, port: Option<u16>, path: String },
}

/// The sources a node fetches from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceAllowList {
    entries: Vec<AllowEntry>,
}

impl Default for SourceAllowList {
    fn default() -> Self {
        Self { entries: OBJECT_STORE_SCHEMES.iter().map(|s| AllowEntry::Scheme((*s).to_string())).collect() }
    }
}

impl SourceAllowList {
    /// The list `entries` names (replacing the default); an entry that is
    /// neither `scheme://` nor a URL with nothing after its path is an
    /// error that names it.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let entries = entries.iter().map(|entry| parse_entry(entry)).collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// Whether the node may fetch `url`.
    pub fn permits(&self, url: &Url) -> bool {
        self.entries.iter().any(|entry| match entry {
            AllowEntry::Scheme(scheme) => url.scheme() == scheme,
            AllowEntry::Prefix { scheme, username, host, port, path } => {
                url.scheme() == scheme
                    && url.username() == username
                    && url.host_str().map(str::to_ascii_lowercase) == *host
                    && url.port_or_known_default() == *port
                    && decoded_path(url).is_some_and(|p| under(&p, path))
            }
        })
    }

    /// The entries as the config would give them, for errors.
    pub fn describe(&self) -> String {
        let shown: Vec<String> = self
            .entries
            .iter()
            .map(|entry| match entry {
                AllowEntry::Scheme(scheme) => format!("{scheme}://"),
                AllowEntry::Prefix { scheme, username, host, port, path } => {
                    let user = if username.is_empty() { String::new() } else { format!("{username}@") };
                    let port = port.map(|p| format!(":{p}")).unwrap_or_default();
                    format!("{scheme}://{user}{}{port}{path}", host.as_deref().unwrap_or(""))
                }
            })
            .collect();
        if shown.is_empty() {
            "nothing".to_string()
        } else {
            shown.join(", ")
        }
    }
}

fn parse_entry(entry: &str) -> Result<AllowEntry, String> {
    let bad = |why: &str| format!("source_allow entry {entry:?}: {why}");
    if let Some(scheme) = entry.strip_suffix("://") {
        if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            return Ok(AllowEntry::Scheme(scheme.to_ascii_lowercase()));
        }
    }
    let url = Url::parse(entry).map_err(|e| bad(&e.to_string()))?;
    if url.query().is_some() || url.fragment().is_some() || url.password().is_some() {
        return Err(bad("a scheme (s3://) or a URL prefix, with no query, fragment or password"));
    }
    if url.host_str().is_none_or(str::is_empty) && url.scheme() != "file" {
        return Err(bad("a prefix names its bucket or host (or write the scheme alone, s3://, for all of it)"));
    }
    let path = decoded_path(&url).ok_or_else(|| bad("its path is not UTF-8 once decoded"))?;
    Ok(AllowEntry::Prefix {
        scheme: url.scheme().to_string(),
        username: url.username().to_string(),
        host: url.host_str().filter(|h| !h.is_empty()).map(str::to_ascii_lowercase),
        port: url.port_or_known_default(),
        path,
    })
}

/// The URL's path, percent-decoded, so that `%70ublic` is `public`.
fn decoded_path(url: &Url) -> Option<String> {
    percent_decode_str(url.path()).decode_utf8().ok().map(|p| p.into_owned())
}

/// Whether `path` is `prefix` or lies under it: a prefix ending in `/`
/// takes what starts with it; another takes itself and what lies under it
/// as a directory (`/sets` takes `/sets/a`, not `/settings`). A path with
/// a `..` segment is under nothing.
fn under(path: &str, prefix: &str) -> bool {
    if path.split('/').any(|segment| segment == "..") {
        return false;
    }
    if prefix.ends_with('/') || prefix.is_empty() {
        return path.starts_with(prefix);
    }
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(list: &SourceAllowList, url: &str) -> bool {
        list.permits(&Url::parse(url).expect("url"))
    }

    /// `list` permits every URL of `allowed` and none of `refused`.
    fn check(list: &SourceAllowList, allowed: &[&str], refused: &[&str]) {
        for url in allowed {
            assert!(permits(list, url), "{url} is allowed");
        }
        for url in refused {
            assert!(!permits(list, url), "{url} is refused");
        }
    }

    #[test]
    fn by_default_object_stores_only() {
        check(
            &SourceAllowList::default(),
            &["s3://any-bucket/key", "gs://b/k", "az://container/k", "abfss://c@acct.dfs.core.windows.net/k"],
            &[
                "file:///var/lib/sluice/admin.token",
                "http://169.254.169.254/latest/meta-data/iam/security-credentials/node",
                "http://127.0.0.1:2379/v3/kv/range",
                "https://internal.example.com/secrets",
            ],
        );
    }

    #[test]
    fn a_prefix_takes_its_origin_and_what_lies_under_its_path() {
        let entries: Vec<String> = [
            "s3://corpus/tokenized/",
            "https://Data.Example.com/sets",
            "file:///srv/datasets/",
            "http://127.0.0.1:9000/",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        let list = SourceAllowList::parse(&entries).expect("parse");
        check(
            &list,
            &[
                "s3://corpus/tokenized/shard-0.npy",
                "s3://corpus/tokenized/a/b",
                "https://data.example.com/sets",
                "https://data.example.com:443/sets/x.tar",
                "https://data.example.com/%73ets/x.tar",
                "file:///srv/datasets/a.bin",
                "http://127.0.0.1:9000/train/x.bin",
            ],
            &[
                "s3://corpus/raw/x",
                "s3://corpus/tokenized",
                "s3://other/tokenized/x",
                "gs://corpus/tokenized/x",
                "https://data.example.com/settings",
                "https://data.example.com:8443/sets/x",
                "http://data.example.com/sets/x",
                "https://user@data.example.com/sets/x",
                "https://data.example.com/sets/..%2Fprivate",
                "file:///srv/datasets-old/a.bin",
                "file:///etc/shadow",
                "http://127.0.0.1:9001/train/x.bin",
                "http://127.0.0.1:9000@169.254.169.254/latest",
                "http://localhost:9000/train/x.bin",
            ],
        );
        assert_eq!(
            list.describe(),
            "s3://corpus/tokenized/, https://data.example.com:443/sets, file:///srv/datasets/, http://127.0.0.1:9000/"
        );
    }

    #[test]
    fn entries_that_name_no_prefix_are_refused_by_name() {
        for entry in ["s3:", "https://", "s3://bucket/key?versionId=1", "https://u:p@host/", "not a url", "s3:///x"] {
            let err = SourceAllowList::parse(&[entry.to_string()]).map_or_else(|e| e, |_| String::new());
            if entry == "https://" {
                assert_eq!(err, "", "a scheme alone is an entry");
            } else {
                assert!(err.contains(&format!("{entry:?}")), "{entry}: {err}");
            }
        }
        let none = SourceAllowList::parse(&[]).expect("an empty list");
        assert!(!permits(&none, "s3://b/k"), "an empty list allows nothing");
        assert_eq!(none.describe(), "nothing");
    }
}
