//! Streaming index of WebDataset tar shards: members grouped into samples by
//! key (the path up to the first dot of the file name), each sample one
//! contiguous span of the shard, headers included, so a sample is one read.
//!
//! A member's path is its ustar name and prefix, unless a GNU long-name
//! header (`L`) or a pax extended header (`x`, POSIX.1-2001) before it says
//! otherwise. Python's `tarfile`, and so WebDataset's `TarWriter`, writes pax
//! by default: a path longer than the ustar fields or with a character
//! outside ASCII stands whole only in the pax header's `path` record (the
//! ustar name is cut at 100 bytes, or has `?` for each such character). A
//! pax `size` record likewise stands for a member too large for the ustar
//! field.

/// Tar block size.
pub const BLOCK_BYTES: u64 = 512;
/// Longest member name accepted (GNU long names and pax paths included).
const NAME_BYTES_MAX: usize = 4096;
/// Largest pax extended header accepted: its records (path, size, times,
/// owner) take a few hundred bytes in practice.
const PAX_BYTES_MAX: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TarError {
    #[error("tar header at byte {at}: {what}")]
    Header { at: u64, what: String },
    #[error("tar shard ends inside a member (at byte {0})")]
    Truncated(u64),
}

/// One sample's span inside the shard, relative to the shard's start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleSpan {
    pub key: String,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub members: u32,
}

/// A header whose data describes the next member: its path (a GNU long
/// name), or records that override its path and size (a pax extended
/// header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Extension {
    LongName,
    Pax,
}

/// Path and size a pax extended header gives the member after it.
#[derive(Debug, Default, PartialEq, Eq)]
struct PaxOverrides {
    path: Option<String>,
    size: Option<u64>,
}

/// What a header is, by its type flag: the one reading of type flags that
/// the indexer and the splitter ([`keyed_members`]) share, so that a span
/// splits into the members it was indexed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Header {
    /// Describes the next member (`L`, `x`).
    Extension(Extension),
    /// A long link name (`K`) or a global pax header (`g`, nothing in it
    /// names one member): its data is skipped.
    Skipped,
    /// A member's own header; only a regular file (`0`, NUL, `7`) can be
    /// a sample's member.
    Member { regular: bool },
}

fn header_kind(typeflag: u8) -> Header {
    match typeflag {
        b'L' => Header::Extension(Extension::LongName),
        b'x' => Header::Extension(Extension::Pax),
        b'K' | b'g' => Header::Skipped,
        b'0' | 0 | b'7' => Header::Member { regular: true },
        _ => Header::Member { regular: false },
    }
}

/// What the extension headers read since the last member give the next
/// one: its path and its size.
#[derive(Debug, Default)]
struct Pending {
    name: Option<String>,
    size: Option<u64>,
}

impl Pending {
    /// Takes an extension header's data (its size, not its padding).
    fn extension(&mut self, kind: Extension, data: &[u8]) -> Result<(), &'static str> {
        match kind {
            // An empty long name names nothing.
            Extension::LongName if data.first().is_some_and(|&b| b != 0) => self.name = Some(text(data)),
            Extension::LongName => {}
            Extension::Pax => {
                let overrides = pax_overrides(data)?;
                if let Some(path) = overrides.path {
                    self.name = Some(path);
                }
                if let Some(size) = overrides.size {
                    self.size = Some(size);
                }
            }
        }
        Ok(())
    }

    /// A member's header is read: the path the extensions gave it (else its
    /// own fields are its path) and its size (`own` unless an extension
    /// gave one). Nothing stays pending for the member after it.
    fn member(&mut self, own_size: u64) -> (Option<String>, u64) {
        (self.name.take(), self.size.take().unwrap_or(own_size))
    }
}

enum Phase {
    /// Expecting a header block.
    Header,
    /// Inside a member's data (and padding): bytes left, and, where the data
    /// describes the next header, what it is and how many of the bytes left
    /// are its (the rest is padding).
    Data { left: u64, extension: Option<(Extension, u64)> },
    /// Two zero blocks seen (or one, waiting for the second).
    End,
}

/// Feed it the shard's bytes in any pieces; it yields sample spans.
pub struct TarIndexer {
    at: u64,
    phase: Phase,
    block: Vec<u8>,
    /// The data of the extension header being read.
    extension: Vec<u8>,
    pending: Pending,
    /// Start of the headers of the member being read (long-name and pax
    /// headers included).
    member_start: Option<u64>,
    current: Option<SampleSpan>,
    /// The extensions (lowercased) of the current sample's members: one
    /// sample cannot hold two members of one extension.
    current_extensions: Vec<String>,
    done: Vec<SampleSpan>,
    zero_blocks: u32,
}

impl Default for TarIndexer {
    fn default() -> Self {
        Self::new()
    }
}

fn octal(field: &[u8]) -> Option<u64> {
    let text: String = field.iter().take_while(|&&b| b != 0).map(|&b| b as char).collect();
    let text = text.trim();
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(&field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())]).into_owned()
}

/// The records of a pax extended header (`"<length> <key>=<value>\n"` each):
/// the path and size they give the next member. Other keys (times, owner,
/// charset) are nothing to the index.
fn pax_overrides(data: &[u8]) -> Result<PaxOverrides, &'static str> {
    let mut overrides = PaxOverrides::default();
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest.iter().position(|&b| b == b' ').ok_or("pax record without a length")?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|digits| digits.parse().ok())
            .ok_or("pax record length is not a number")?;
        if len <= space + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err("pax record length does not match its record");
        }
        let record = &rest[space + 1..len - 1];
        let equals = record.iter().position(|&b| b == b'=').ok_or("pax record without '='")?;
        let (key, value) = (&record[..equals], &record[equals + 1..]);
        match key {
            b"path" if value.len() > NAME_BYTES_MAX => return Err("pax path too long"),
            b"path" => overrides.path = Some(String::from_utf8_lossy(value).into_owned()),
            b"size" => {
                let size = std::str::from_utf8(value).ok().and_then(|digits| digits.parse().ok());
                overrides.size = Some(size.ok_or("pax size is not a number")?);
            }
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok(overrides)
}

/// What a shard that is not tar but starts with a compressor's magic bytes
/// is: WebDataset reads such shards whole, but a sample of one is no byte
/// range of it, so it must be decompressed before ingest.
fn compression(first_block: &[u8]) -> Option<&'static str> {
    const MAGIC: [(&[u8], &str); 4] = [
        (b"\x1f\x8b", "a gzip-compressed shard: ingest the tar inside it (gunzip it first)"),
        (b"\x28\xb5\x2f\xfd", "a zstd-compressed shard: ingest the tar inside it (zstd -d it first)"),
        (b"BZh", "a bzip2-compressed shard: ingest the tar inside it (bunzip2 it first)"),
        (b"\xfd7zXZ\x00", "an xz-compressed shard: ingest the tar inside it (unxz it first)"),
    ];
    MAGIC.iter().find(|(magic, _)| first_block.starts_with(magic)).map(|&(_, what)| what)
}

/// A member's data size padded to whole blocks, or `None` where that
/// overflows (only a pax `size` can be that large).
fn padded_len(size: u64) -> Option<u64> {
    size.checked_next_multiple_of(BLOCK_BYTES)
}

/// A header's member path: ustar prefix and name.
fn header_name(block: &[u8]) -> String {
    let name = text(&block[..100]);
    if &block[257..262] != b"ustar" {
        return name;
    }
    match text(&block[345..500]) {
        prefix if prefix.is_empty() => name,
        prefix => format!("{prefix}/{name}"),
    }
}

/// How WebDataset takes a member path into a sample (the `webdataset`
/// package's `tar_file_iterator` and `base_plus_ext`): its key and its
/// extension, or `None` for a member WebDataset passes over, metadata named
/// `__…__` at the top of the shard, or a file name with no extension.
///
/// The key is the path up to the first dot of the file name. A file name
/// that starts with its dot (`dir/.hidden`) keys by its directories, where
/// WebDataset's pattern allows that. Readers lowercase the extension, as
/// WebDataset does by default.
pub fn sample_key(path: &str) -> Option<(&str, &str)> {
    let first = path.split('/').next().unwrap_or(path);
    let metadata = first.starts_with("__") && first.ends_with("__") && (first.len() >= 4 || first == path);
    if metadata {
        return None;
    }
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = base_start + path[base_start..].find('.')?;
    if dot > base_start {
        return Some((&path[..dot], &path[dot + 1..]));
    }
    // WebDataset's pattern, `^((?:.*/|)[^.]+)[.]([^/]*)$`, then needs
    // dot-free characters before the file name, after a `/` or the start.
    let dirs = &path[..base_start];
    let keyed = match dirs.rfind('.') {
        None => !dirs.is_empty(),
        Some(last_dot) => dirs[last_dot..dirs.len() - 1].contains('/'),
    };
    keyed.then(|| (dirs, &path[dot + 1..]))
}

impl TarIndexer {
    pub fn new() -> Self {
        Self {
            at: 0,
            phase: Phase::Header,
            block: Vec::with_capacity(BLOCK_BYTES as usize),
            extension: Vec::new(),
            pending: Pending::default(),
            member_start: None,
            current: None,
            current_extensions: Vec::new(),
            done: Vec::new(),
            zero_blocks: 0,
        }
    }

    /// Takes the next bytes of the shard.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<(), TarError> {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Data { left, extension } => {
                    let take = (*left).min(bytes.len() as u64) as usize;
                    if let Some((_, kept_left)) = extension {
                        let keep = (*kept_left).min(take as u64) as usize;
                        self.extension.extend_from_slice(&bytes[..keep]);
                        *kept_left -= keep as u64;
                    }
                    *left -= take as u64;
                    self.at += take as u64;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        if let Some((kind, _)) = *extension {
                            self.end_extension(kind)?;
                        }
                        self.phase = Phase::Header;
                    }
                }
                Phase::Header | Phase::End => {
                    let take = (BLOCK_BYTES as usize - self.block.len()).min(bytes.len());
                    self.block.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.block.len() == BLOCK_BYTES as usize {
                        let block = std::mem::take(&mut self.block);
                        self.header(&block)?;
                        self.block = block;
                        self.block.clear();
                    }
                }
            }
        }
        Ok(())
    }

    fn header(&mut self, block: &[u8]) -> Result<(), TarError> {
        let start = self.at;
        self.at += BLOCK_BYTES;
        if block.iter().all(|&b| b == 0) {
            self.zero_blocks += 1;
            self.phase = Phase::End;
            return Ok(());
        }
        if matches!(self.phase, Phase::End) {
            return Err(TarError::Header { at: start, what: "data after the end-of-archive marker".into() });
        }
        let bad = |what: &str| TarError::Header { at: start, what: what.to_string() };
        // A shard's first block that is no tar header may be a compressed one.
        let not_tar = |what: &'static str| bad(compression(block).filter(|_| start == 0).unwrap_or(what));
        let stored: u64 = octal(&block[148..156]).ok_or_else(|| not_tar("checksum is not octal: not a tar shard"))?;
        let sum: u64 =
            block.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
        if stored != sum {
            return Err(not_tar("checksum mismatch: not a tar shard"));
        }
        let size = octal(&block[124..136]).ok_or_else(|| bad("size is not octal"))?;
        let typeflag = block[156];
        self.member_start.get_or_insert(start);
        let extension = match header_kind(typeflag) {
            Header::Extension(Extension::LongName) if size > NAME_BYTES_MAX as u64 => {
                return Err(bad("long name too long"))
            }
            Header::Extension(Extension::Pax) if size > PAX_BYTES_MAX as u64 => return Err(bad("pax header too long")),
            Header::Extension(kind) => Some(kind),
            Header::Skipped => None,
            Header::Member { regular } => return self.member(block, start, size, regular),
        };
        let padded = padded_len(size).ok_or_else(|| bad("size too large"))?;
        if padded > 0 {
            self.phase = Phase::Data { left: padded, extension: extension.map(|kind| (kind, size)) };
        } else if let Some(kind) = extension {
            self.end_extension(kind)?;
        }
        Ok(())
    }

    /// Takes what the extension header just read says of the next member.
    fn end_extension(&mut self, kind: Extension) -> Result<(), TarError> {
        let taken = self.pending.extension(kind, &self.extension);
        self.extension.clear();
        taken.map_err(|what| TarError::Header { at: self.at, what: what.to_string() })
    }

    /// A member's own header: a regular file's joins its sample or starts
    /// the next; any other (a directory, a link) is skipped.
    fn member(&mut self, block: &[u8], start: u64, size: u64, regular: bool) -> Result<(), TarError> {
        let (name, size) = self.pending.member(size);
        let padded = padded_len(size).ok_or_else(|| TarError::Header { at: start, what: "size too large".into() })?;
        let member_start = self.member_start.take().unwrap_or(start);
        let end =
            self.at.checked_add(padded).ok_or_else(|| TarError::Header { at: start, what: "size too large".into() })?;
        if regular {
            let name = name.unwrap_or_else(|| header_name(block));
            if let Some((key, extension)) = sample_key(&name) {
                self.join_sample(key, extension.to_lowercase(), member_start..end, start)?;
            }
        }
        self.phase = if padded > 0 { Phase::Data { left: padded, extension: None } } else { Phase::Header };
        Ok(())
    }

    /// A member of sample `key` spanning `member` (its headers and data)
    /// joins the current sample, or ends it and starts the next.
    fn join_sample(
        &mut self,
        key: &str,
        extension: String,
        member: std::ops::Range<u64>,
        header_at: u64,
    ) -> Result<(), TarError> {
        match &mut self.current {
            Some(sample) if sample.key == key => {
                if self.current_extensions.contains(&extension) {
                    return Err(TarError::Header {
                        at: header_at,
                        what: format!("sample {key:?} has two members with the extension {extension:?}"),
                    });
                }
                sample.len_bytes = member.end - sample.offset_bytes;
                sample.members += 1;
            }
            _ => {
                if let Some(sample) = self.current.take() {
                    self.done.push(sample);
                }
                self.current_extensions.clear();
                self.current = Some(SampleSpan {
                    key: key.to_string(),
                    offset_bytes: member.start,
                    len_bytes: member.end - member.start,
                    members: 1,
                });
            }
        }
        self.current_extensions.push(extension);
        Ok(())
    }

    /// Samples completed so far (a sample completes when the next key starts
    /// or the shard ends).
    pub fn take_completed(&mut self) -> Vec<SampleSpan> {
        std::mem::take(&mut self.done)
    }

    /// Ends the shard: `len_bytes` is how many bytes it had.
    pub fn finish(mut self) -> Result<Vec<SampleSpan>, TarError> {
        if !matches!(self.phase, Phase::Header | Phase::End) || !self.block.is_empty() {
            return Err(TarError::Truncated(self.at));
        }
        if let Some(sample) = self.current.take() {
            self.done.push(sample);
        }
        Ok(self.done)
    }
}

/// Splits a sample span back into `(member suffix, data)` pairs.
pub fn members(span: &[u8]) -> Result<Vec<(String, &[u8])>, TarError> {
    Ok(keyed_members(span)?.into_iter().map(|(_, suffix, data)| (suffix, data)).collect())
}

/// One member of a sample: its key, its suffix (WebDataset's extension)
/// and its data.
pub type KeyedMember<'a> = (String, String, &'a [u8]);

/// Splits a sample span into `(key, member suffix, data)` per regular
/// member that WebDataset takes, keyed as the indexer keyed them
/// ([`sample_key`]) and the suffix lowercased: what a reader of a `wds`
/// dataset turns into WebDataset's sample dicts.
pub fn keyed_members(span: &[u8]) -> Result<Vec<KeyedMember<'_>>, TarError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let mut pending = Pending::default();
    while at + BLOCK_BYTES as usize <= span.len() {
        let block = &span[at..at + BLOCK_BYTES as usize];
        if block.iter().all(|&b| b == 0) {
            break;
        }
        let bad = |what: &str| TarError::Header { at: at as u64, what: what.to_string() };
        let kind = header_kind(block[156]);
        let own_size = octal(&block[124..136]).ok_or_else(|| bad("size is not octal"))?;
        let (name, size) = match kind {
            Header::Member { .. } => pending.member(own_size),
            Header::Extension(_) | Header::Skipped => (None, own_size),
        };
        let data_start = at + BLOCK_BYTES as usize;
        let data = usize::try_from(size)
            .ok()
            .and_then(|size| span.get(data_start..data_start.checked_add(size)?))
            .ok_or(TarError::Truncated(at as u64))?;
        match kind {
            Header::Extension(extension) => pending.extension(extension, data).map_err(bad)?,
            Header::Skipped | Header::Member { regular: false } => {}
            Header::Member { regular: true } => {
                let name = name.unwrap_or_else(|| header_name(block));
                if let Some((key, suffix)) = sample_key(&name) {
                    out.push((key.to_string(), suffix.to_lowercase(), data));
                }
            }
        }
        at = data_start + data.len().next_multiple_of(BLOCK_BYTES as usize);
    }
    Ok(out)
}

/// Writes a minimal ustar archive of `members`; for tests and demos.
pub fn write_tar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        append_member(&mut out, name.as_bytes(), b'0', data);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Appends one member (header, data, padding) to `out`; `name` is cut to the
/// ustar name field's 100 bytes.
fn append_member(out: &mut Vec<u8>, name: &[u8], typeflag: u8, data: &[u8]) {
    let mut header = [0u8; 512];
    let name = &name[..name.len().min(100)];
    header[..name.len()].copy_from_slice(name);
    header[100..107].copy_from_slice(b"0000644");
    header[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    header[136..147].copy_from_slice(b"00000000000");
    header[156] = typeflag;
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Members sharing a key become one sample spanning their headers and
    /// data; splitting the span gives the members back.
    #[test]
    fn groups_members_by_key() {
        let shard = write_tar(&[
            ("a/000.jpg", b"JPEG0"),
            ("a/000.cls", b"3"),
            ("a/001.jpg", &[9u8; 700]),
            ("a/001.json", b"{}"),
            ("a/001.cls", b"4"),
        ]);
        for piece in [1, 100, 512, 100_000] {
            let mut indexer = TarIndexer::new();
            for part in shard.chunks(piece) {
                indexer.push(part).expect("push");
            }
            let samples = indexer.finish().expect("finish");
            assert_eq!(samples.len(), 2);
            assert_eq!((samples[0].key.as_str(), samples[0].members), ("a/000", 2));
            assert_eq!((samples[1].key.as_str(), samples[1].members), ("a/001", 3));
            assert_eq!(samples[0].offset_bytes, 0);
            assert_eq!(samples[1].offset_bytes, samples[0].len_bytes);
            let span =
                &shard[samples[1].offset_bytes as usize..(samples[1].offset_bytes + samples[1].len_bytes) as usize];
            let got = members(span).expect("members");
            let keys: Vec<String> = keyed_members(span).expect("members").into_iter().map(|(key, _, _)| key).collect();
            assert_eq!(keys, ["a/001"; 3], "every member keyed as the indexer keyed the sample");
            let want: Vec<(String, &[u8])> =
                vec![("jpg".into(), &[9u8; 700][..]), ("json".into(), &b"{}"[..]), ("cls".into(), &b"4"[..])];
            assert_eq!(got, want);
        }
    }

    /// One pax record, `"<length> <key>=<value>\n"`, its length counting
    /// its own digits.
    fn pax_record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while len.to_string().len() + body.len() > len {
            len += 1;
        }
        format!("{len}{body}")
    }

    /// A shard as Python's `tarfile` writes one (pax, its default): each
    /// member after a pax header holding its whole path, its ustar name the
    /// path with `?` for each character outside ASCII, cut at 100 bytes.
    fn write_pax_tar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, data) in members {
            let records = pax_record("mtime", "1733500000.25") + &pax_record("path", path);
            append_member(&mut out, b"././@PaxHeader", b'x', records.as_bytes());
            let ascii: String = path.chars().map(|c| if c.is_ascii() { c } else { '?' }).collect();
            append_member(&mut out, ascii.as_bytes(), b'0', data);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    fn index_in_pieces(shard: &[u8], piece: usize) -> Vec<SampleSpan> {
        let mut indexer = TarIndexer::new();
        for part in shard.chunks(piece) {
            indexer.push(part).expect("push");
        }
        indexer.finish().expect("finish")
    }

    fn span<'a>(shard: &'a [u8], sample: &SampleSpan) -> &'a [u8] {
        &shard[sample.offset_bytes as usize..(sample.offset_bytes + sample.len_bytes) as usize]
    }

    /// Paths that only a pax header holds whole (longer than the ustar
    /// name, or beyond ASCII) key their samples by the whole path, as
    /// WebDataset's reader (Python's `tarfile`) keys them.
    #[test]
    fn pax_paths_key_the_samples() {
        let long = format!("laion/{}/000001", "part-0000123/".repeat(9));
        assert!(long.len() > 100);
        let shard = write_pax_tar(&[
            (&format!("{long}.jpg"), b"JPEG"),
            (&format!("{long}.cls"), b"7"),
            ("données/0002.txt", b"deux"),
            ("données/0002.cls", b"2"),
            ("donnees/0002.txt", b"two"),
        ]);
        for piece in [1, 7, 512, 100_000] {
            let samples = index_in_pieces(&shard, piece);
            let keys: Vec<(&str, u32)> = samples.iter().map(|s| (s.key.as_str(), s.members)).collect();
            assert_eq!(keys, [(long.as_str(), 2), ("données/0002", 2), ("donnees/0002", 1)]);
            assert_eq!(samples[0].offset_bytes, 0, "a sample starts at its first member's pax header");
            let members = keyed_members(span(&shard, &samples[0])).expect("members");
            let want: Vec<KeyedMember<'_>> =
                vec![(long.clone(), "jpg".into(), &b"JPEG"[..]), (long.clone(), "cls".into(), &b"7"[..])];
            assert_eq!(members, want);
            let members = keyed_members(span(&shard, &samples[1])).expect("members");
            assert_eq!(members[0], ("données/0002".to_string(), "txt".to_string(), &b"deux"[..]));
        }

        // GNU tar's long names, as before.
        let mut gnu = Vec::new();
        append_member(&mut gnu, b"././@LongLink", b'L', format!("{long}.txt\0").as_bytes());
        append_member(&mut gnu, long.as_bytes(), b'0', b"text");
        gnu.extend_from_slice(&[0u8; 1024]);
        let samples = index_in_pieces(&gnu, 512);
        assert_eq!((samples[0].key.as_str(), samples[0].members), (long.as_str(), 1));
        assert_eq!(keyed_members(span(&gnu, &samples[0])).expect("members")[0].1, "txt");
    }

    /// A pax `size` stands for the ustar size field (which a member over
    /// 8 GiB cannot fill); one that cannot be a size is refused.
    #[test]
    fn pax_sizes_stand_for_the_ustar_size() {
        let data = [5u8; 700];
        let mut shard = Vec::new();
        append_member(&mut shard, b"././@PaxHeader", b'x', pax_record("size", "700").as_bytes());
        let at = shard.len();
        append_member(&mut shard, b"k.bin", b'0', &data);
        // The ustar field says 0, as a writer says for a size it cannot hold.
        shard[at + 124..at + 135].copy_from_slice(b"00000000000");
        shard[at + 148..at + 156].copy_from_slice(b"        ");
        let sum: u32 = shard[at..at + 512].iter().map(|&b| u32::from(b)).sum();
        shard[at + 148..at + 155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        append_member(&mut shard, b"l.bin", b'0', b"next");
        shard.extend_from_slice(&[0u8; 1024]);

        let samples = index_in_pieces(&shard, 100);
        assert_eq!(samples.len(), 2, "the 700 bytes are data, not headers");
        assert_eq!(samples[0].len_bytes, 512 * 3 + 1024, "pax header and its records, header, data");
        assert_eq!(keyed_members(span(&shard, &samples[0])).expect("members")[0].2, &data[..]);
        assert_eq!(keyed_members(span(&shard, &samples[1])).expect("members")[0].2, b"next");

        for records in [pax_record("size", "18446744073709551615"), pax_record("size", "many")] {
            let mut shard = Vec::new();
            append_member(&mut shard, b"././@PaxHeader", b'x', records.as_bytes());
            append_member(&mut shard, b"k.bin", b'0', b"x");
            let mut indexer = TarIndexer::new();
            let pushed = indexer.push(&shard).and_then(|()| indexer.finish().map(drop));
            assert!(pushed.is_err(), "{records:?} accepted");
            assert!(keyed_members(&shard).is_err(), "{records:?} accepted by the splitter");
        }
    }

    /// Pax records whose lengths do not match them are refused, not read
    /// past.
    #[test]
    fn refuses_malformed_pax_records() {
        for records in ["30 path=short\n", "9 path=x", "x path=y\n", "12 pathnoeq\n", "3 \n"] {
            assert!(pax_overrides(records.as_bytes()).is_err(), "{records:?} accepted");
            let mut shard = Vec::new();
            append_member(&mut shard, b"././@PaxHeader", b'x', records.as_bytes());
            append_member(&mut shard, b"k.bin", b'0', b"x");
            assert!(TarIndexer::new().push(&shard).is_err(), "{records:?} indexed");
        }
        let fine = pax_record("path", "a/b.c") + &pax_record("uname", "root");
        let want = PaxOverrides { path: Some("a/b.c".into()), size: None };
        assert_eq!(pax_overrides(fine.as_bytes()), Ok(want));
    }

    /// Keys and extensions as WebDataset's reader makes them: metadata
    /// and names without an extension passed over, extensions lowercased,
    /// a file name that starts with its dot keyed by its directories.
    #[test]
    fn keys_samples_as_webdataset_does() {
        assert_eq!(sample_key("a/000.jpg"), Some(("a/000", "jpg")));
        assert_eq!(sample_key("a.b/000.seg.png"), Some(("a.b/000", "seg.png")));
        assert_eq!(sample_key("x/.hidden"), Some(("x/", "hidden")));
        assert_eq!(sample_key("a.b/c/.h"), Some(("a.b/c/", "h")));
        assert_eq!(sample_key("k."), Some(("k", "")));
        for passed_over in ["README", "dir/LICENSE", ".hidden", "a.b/.h", "__index__", "__meta__/info.json", "___"] {
            assert_eq!(sample_key(passed_over), None, "{passed_over}");
        }
        assert_eq!(sample_key("__key__.txt"), Some(("__key__", "txt")), "only a whole `__…__` name is metadata");

        let shard = write_tar(&[
            ("__meta__/info.json", b"{}"),
            ("a/000.JPG", b"jpeg"),
            ("README", b"not a sample"),
            ("a/000.Cls", b"3"),
            ("a/001.txt", b"one"),
        ]);
        let samples = index_in_pieces(&shard, 512);
        let keys: Vec<(&str, u32)> = samples.iter().map(|s| (s.key.as_str(), s.members)).collect();
        assert_eq!(keys, [("a/000", 2), ("a/001", 1)], "README inside a/000's span is not a member of it");
        let members = keyed_members(span(&shard, &samples[0])).expect("members");
        let suffixes: Vec<&str> = members.iter().map(|(_, suffix, _)| suffix.as_str()).collect();
        assert_eq!(suffixes, ["jpg", "cls"]);

        let twice = write_tar(&[("a/000.jpg", b"one"), ("a/000.JPG", b"two")]);
        let mut indexer = TarIndexer::new();
        let refused = indexer.push(&twice).expect_err("two .jpg members of one sample");
        assert!(refused.to_string().contains("two members with the extension \"jpg\""), "{refused}");
    }

    /// A compressed shard is refused with what it is and what to do.
    #[test]
    fn names_a_compressed_shard() {
        let mut gzip = vec![0x1f, 0x8b, 8, 0];
        gzip.resize(600, 7);
        let refused = TarIndexer::new().push(&gzip).expect_err("gzip");
        assert!(refused.to_string().contains("gzip-compressed shard"), "{refused}");
        let mut zstd = vec![0x28, 0xb5, 0x2f, 0xfd];
        zstd.resize(512, 0);
        let refused = TarIndexer::new().push(&zstd).expect_err("zstd");
        assert!(refused.to_string().contains("zstd-compressed"), "{refused}");
        let refused = TarIndexer::new().push(&[b'x'; 512]).expect_err("text");
        assert!(refused.to_string().contains("not a tar shard"), "{refused}");
    }

    /// A cut-off shard and a non-tar file are refused.
    #[test]
    fn refuses_truncated_and_foreign_input() {
        let shard = write_tar(&[("x.bin", &[1u8; 1000])]);
        let mut indexer = TarIndexer::new();
        indexer.push(&shard[..800]).expect("push");
        assert!(matches!(indexer.finish(), Err(TarError::Truncated(_))));
        let mut indexer = TarIndexer::new();
        assert!(indexer.push(&[b'x'; 512]).is_err());
    }

    proptest! {
        /// No input makes the indexer or the splitter panic.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut indexer = TarIndexer::new();
            if indexer.push(&bytes).is_ok() {
                let _ = indexer.finish();
            }
            let _ = members(&bytes);
        }
    }
}
