//! The `.npy` header: enough of NumPy's format to check an array's dtype and
//! find where its data starts and how long it is.

/// Longest header accepted; NumPy's own limit for untrusted files is 10 000.
pub const HEADER_BYTES_MAX: usize = 64 * 1024;
const MAGIC: &[u8; 6] = b"\x93NUMPY";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Bytes before the array data (magic, version, length, dict).
    pub data_offset_bytes: usize,
    pub descr: String,
    pub shape: Vec<u64>,
    pub item_size_bytes: u64,
}

impl NpyHeader {
    pub fn data_len_bytes(&self) -> Option<u64> {
        self.shape.iter().try_fold(self.item_size_bytes, |acc, &dim| acc.checked_mul(dim))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NpyError {
    #[error("not a .npy file (bad magic)")]
    Magic,
    #[error("truncated .npy header")]
    Truncated,
    #[error(".npy format version {0}.{1} is not supported")]
    Version(u8, u8),
    #[error(".npy header of {0} bytes exceeds {HEADER_BYTES_MAX}")]
    TooLong(usize),
    #[error("malformed .npy header: {0}")]
    Malformed(String),
    #[error("Fortran-ordered .npy arrays are not supported")]
    FortranOrder,
}

/// Parses the header at the start of `bytes`. `Truncated` means more bytes
/// are needed (up to [`HEADER_BYTES_MAX`]).
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader, NpyError> {
    if bytes.len() < 10 {
        return if MAGIC.starts_with(&bytes[..bytes.len().min(6)]) {
            Err(NpyError::Truncated)
        } else {
            Err(NpyError::Magic)
        };
    }
    if &bytes[..6] != MAGIC {
        return Err(NpyError::Magic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (dict_len, dict_start) = match major {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(NpyError::Truncated);
            }
            let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (usize::try_from(len).unwrap_or(usize::MAX), 12)
        }
        _ => return Err(NpyError::Version(major, minor)),
    };
    let data_offset_bytes = dict_start.saturating_add(dict_len);
    if data_offset_bytes > HEADER_BYTES_MAX {
        return Err(NpyError::TooLong(data_offset_bytes));
    }
    let dict = bytes.get(dict_start..data_offset_bytes).ok_or(NpyError::Truncated)?;
    let dict = std::str::from_utf8(dict).map_err(|_| NpyError::Malformed("header is not text".into()))?;
    let descr = dict_value(dict, "descr")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"').to_string();
    if dict_value(dict, "fortran_order")? != "False" {
        return Err(NpyError::FortranOrder);
    }
    let shape = parse_shape(&dict_value(dict, "shape")?)?;
    let item_size_bytes = item_size(&descr)?;
    Ok(NpyHeader { data_offset_bytes, descr, shape, item_size_bytes })
}

/// The text of `key`'s value in the header dict: a quoted string, a bare
/// word or a parenthesized tuple.
fn dict_value(dict: &str, key: &str) -> Result<String, NpyError> {
    let missing = || NpyError::Malformed(format!("no '{key}' in header"));
    let at = dict.find(&format!("'{key}'")).ok_or_else(missing)?;
    let rest = dict[at + key.len() + 2..].trim_start();
    let rest = rest.strip_prefix(':').ok_or_else(missing)?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else if let Some(quoted) = rest.strip_prefix('\'') {
        quoted.find('\'').map(|i| i + 2)
    } else {
        rest.find([',', '}'])
    };
    let end = end.ok_or_else(|| NpyError::Malformed(format!("unterminated '{key}'")))?;
    Ok(rest[..end].trim().to_string())
}

fn parse_shape(text: &str) -> Result<Vec<u64>, NpyError> {
    let inner = text
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| NpyError::Malformed(format!("shape {text}")))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| part.trim_end_matches('L').parse::<u64>().map_err(|_| NpyError::Malformed(format!("shape {text}"))))
        .collect()
}

fn item_size(descr: &str) -> Result<u64, NpyError> {
    let digits: String = descr.chars().skip_while(|c| !c.is_ascii_digit()).collect();
    let size = digits.parse::<u64>().map_err(|_| NpyError::Malformed(format!("dtype {descr}")))?;
    if size == 0 || size > 64 {
        return Err(NpyError::Malformed(format!("dtype {descr}")));
    }
    Ok(size)
}

/// Builds a version 1.0 header for a 1-D array; used by tests and demos.
pub fn encode_header(descr: &str, len: u64) -> Vec<u8> {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({len},), }}");
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A header NumPy writes parses to its dtype, shape and data offset.
    #[test]
    fn parses_numpy_headers() {
        let header = encode_header("<u2", 1000);
        let parsed = parse_header(&header).expect("header");
        assert_eq!(parsed.data_offset_bytes, header.len());
        assert_eq!(parsed.data_offset_bytes % 64, 0);
        assert_eq!(parsed.descr, "<u2");
        assert_eq!(parsed.data_len_bytes(), Some(2000));
        let dict = "{'descr': '<u4', 'fortran_order': False, 'shape': (3, 5), }\n";
        let mut two_d = b"\x93NUMPY\x01\x00".to_vec();
        two_d.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        two_d.extend_from_slice(dict.as_bytes());
        let two_d = two_d.as_slice();
        let parsed = parse_header(two_d).expect("2-D header");
        assert_eq!(parsed.shape, vec![3, 5]);
        assert_eq!(parsed.data_len_bytes(), Some(60));
    }

    /// Short input asks for more; foreign input is refused.
    #[test]
    fn truncated_and_foreign_headers() {
        let header = encode_header("<u4", 7);
        assert_eq!(parse_header(&header[..20]), Err(NpyError::Truncated));
        assert_eq!(parse_header(b"\x93NUM"), Err(NpyError::Truncated));
        assert_eq!(parse_header(b"PK\x03\x04 not numpy at all"), Err(NpyError::Magic));
        let at = header.windows(5).position(|w| w == b"False").expect("fortran_order");
        let mut fortran = header.clone();
        fortran[at..at + 5].copy_from_slice(b"True ");
        assert_eq!(parse_header(&fortran), Err(NpyError::FortranOrder));
    }

    proptest! {
        /// No input makes the parser panic.
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut input = b"\x93NUMPY\x01\x00".to_vec();
            input.extend_from_slice(&bytes);
            let _ = parse_header(&input);
            let _ = parse_header(&bytes);
        }
    }
}
