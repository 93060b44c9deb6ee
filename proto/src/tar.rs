//! Streaming index of WebDataset tar shards: members grouped into samples by
//! key (the path up to the first dot of the file name), each sample one
//! contiguous span of the shard, headers included, so a sample is one read.

/// Tar block size.
pub const BLOCK_BYTES: u64 = 512;
/// Longest member name accepted (GNU long names included).
const NAME_BYTES_MAX: usize = 4096;

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

enum Phase {
    /// Expecting a header block.
    Header,
    /// Inside a member's data (and padding): bytes left, and whether the data
    /// is a GNU long name for the next header.
    Data { left: u64, long_name: bool },
    /// Two zero blocks seen (or one, waiting for the second).
    End,
}

/// Feed it the shard's bytes in any pieces; it yields sample spans.
pub struct TarIndexer {
    at: u64,
    phase: Phase,
    block: Vec<u8>,
    long_name: Vec<u8>,
    pending_name: Option<String>,
    /// Start of the headers of the member being read (long-name and pax
    /// headers included).
    member_start: Option<u64>,
    current: Option<SampleSpan>,
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

/// The WebDataset key of a member path: directory plus file name up to its
/// first dot.
pub fn sample_key(path: &str) -> (&str, &str) {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    match path[base_start..].find('.') {
        Some(dot) => (&path[..base_start + dot], &path[base_start + dot + 1..]),
        None => (path, ""),
    }
}

impl TarIndexer {
    pub fn new() -> Self {
        Self {
            at: 0,
            phase: Phase::Header,
            block: Vec::with_capacity(BLOCK_BYTES as usize),
            long_name: Vec::new(),
            pending_name: None,
            member_start: None,
            current: None,
            done: Vec::new(),
            zero_blocks: 0,
        }
    }

    /// Takes the next bytes of the shard.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<(), TarError> {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Data { left, long_name } => {
                    let take = (*left).min(bytes.len() as u64) as usize;
                    if *long_name {
                        self.long_name.extend_from_slice(&bytes[..take]);
                        if self.long_name.len() > NAME_BYTES_MAX + BLOCK_BYTES as usize {
                            return Err(TarError::Header { at: self.at, what: "long name too long".into() });
                        }
                    }
                    *left -= take as u64;
                    self.at += take as u64;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        if *long_name {
                            self.pending_name = Some(text(&self.long_name));
                            self.long_name.clear();
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
        let stored: u64 = octal(&block[148..156]).ok_or_else(|| bad("checksum is not octal"))?;
        let sum: u64 =
            block.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
        if stored != sum {
            return Err(bad("checksum mismatch: not a tar shard"));
        }
        let size = octal(&block[124..136]).ok_or_else(|| bad("size is not octal"))?;
        let padded = size.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let typeflag = block[156];
        self.member_start.get_or_insert(start);
        match typeflag {
            b'L' => {
                if size as usize > NAME_BYTES_MAX {
                    return Err(bad("long name too long"));
                }
                self.phase = Phase::Data { left: padded, long_name: true };
                return Ok(());
            }
            b'x' | b'g' => {
                self.phase = if padded > 0 { Phase::Data { left: padded, long_name: false } } else { Phase::Header };
                return Ok(());
            }
            _ => {}
        }
        let name = self.pending_name.take().unwrap_or_else(|| header_name(block));
        let member_start = self.member_start.take().unwrap_or(start);
        let end = self.at + padded;
        if matches!(typeflag, b'0' | 0 | b'7') {
            let (key, _) = sample_key(&name);
            match &mut self.current {
                Some(sample) if sample.key == key => {
                    sample.len_bytes = end - sample.offset_bytes;
                    sample.members += 1;
                }
                _ => {
                    if let Some(sample) = self.current.take() {
                        self.done.push(sample);
                    }
                    self.current = Some(SampleSpan {
                        key: key.to_string(),
                        offset_bytes: member_start,
                        len_bytes: end - member_start,
                        members: 1,
                    });
                }
            }
        }
        self.phase = if padded > 0 { Phase::Data { left: padded, long_name: false } } else { Phase::Header };
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
/// member, keyed as the indexer keyed them ([`sample_key`]): what a reader
/// of a `wds` dataset turns into WebDataset's sample dicts.
pub fn keyed_members(span: &[u8]) -> Result<Vec<KeyedMember<'_>>, TarError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let mut long_name: Option<String> = None;
    while at + BLOCK_BYTES as usize <= span.len() {
        let block = &span[at..at + BLOCK_BYTES as usize];
        if block.iter().all(|&b| b == 0) {
            break;
        }
        let size = octal(&block[124..136])
            .ok_or_else(|| TarError::Header { at: at as u64, what: "size is not octal".into() })?
            as usize;
        let data_start = at + BLOCK_BYTES as usize;
        let data = span.get(data_start..data_start + size).ok_or(TarError::Truncated(at as u64))?;
        match block[156] {
            b'L' => long_name = Some(text(data)),
            b'x' | b'g' => {}
            b'0' | 0 | b'7' => {
                let name = long_name.take().unwrap_or_else(|| header_name(block));
                let (key, suffix) = sample_key(&name);
                out.push((key.to_string(), suffix.to_string(), data));
            }
            _ => {}
        }
        at = data_start + size.div_ceil(BLOCK_BYTES as usize) * BLOCK_BYTES as usize;
    }
    Ok(out)
}

/// Writes a minimal ustar archive of `members`; for tests and demos.
pub fn write_tar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        let mut header = [0u8; 512];
        header[..name.len()].copy_from_slice(name.as_bytes());
        header[100..107].copy_from_slice(b"0000644");
        header[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = b'0';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
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
