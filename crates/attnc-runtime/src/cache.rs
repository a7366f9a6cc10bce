//! The two-level artifact cache: memory, then disk, then build — with exactly one build
//! per key when many threads or processes ask at once.
//!
//! It is generic over what is cached ([`Producer`]), so all of its logic (disk format,
//! corruption handling, locking) is tested on the CPU without CUDA; the JIT plugs in a
//! producer whose build lowers a spec to PTX and has the driver compile it, and whose
//! decode loads a cached cubin.
//!
//! # Lookup
//! 1. **Memory**: one slot per key (`Mutex<Option<Arc<T>>>`). The slot's mutex is held
//!    for the whole lookup, so threads asking for the same key queue behind the first
//!    one and find its result: one build per key per process. Different keys do not
//!    wait for each other.
//! 2. **Disk** (when configured): `<dir>/<key hex>.attnc`. Read without a lock first (the
//!    common warm case costs one file read); a valid entry is decoded and kept in memory.
//! 3. **Build**: take the key's lock file (`<dir>/<key hex>.lock`, `flock`, exclusive,
//!    blocking) so only one *process* builds; look at the disk again (another process may
//!    have finished meanwhile); build; write the entry atomically (a temporary file in
//!    the same directory, fsync, rename) and release the lock.
//!
//! # Disk entries
//! A 48-byte little-endian header — magic `ATTNCJIT`, format version (u32), key text
//! length (u32), key hash (u128), payload length (u64), checksum (u64, FNV-1a over key
//! text and payload) — then the full key text, then the payload. On load every field is
//! checked and the key text compared (so even a hash collision cannot serve a wrong
//! entry). A truncated, flipped or otherwise bad entry, or one the producer cannot decode,
//! is deleted (under the key's lock) and rebuilt; [`CacheStats::discarded`] counts them.
//! A failed write is counted ([`CacheStats::write_errors`]) and otherwise ignored: the
//! build's result is still returned and kept in memory.

use crate::hash::{fnv1a128_words, fnv1a64};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Magic bytes at the start of every disk entry.
pub const MAGIC: &[u8; 8] = b"ATTNCJIT";
/// Version of the disk entry layout (the header, not the payload).
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 48;
/// File extension of entries.
pub const ENTRY_EXT: &str = "attnc";

/// A cache key: the full text of everything that decides the artifact, and its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    hash: u128,
    text: String,
}

impl CacheKey {
    /// A key from `name = value` parts, in the given order.
    pub fn from_parts<S: AsRef<str>>(parts: &[(&str, S)]) -> CacheKey {
        let mut text = String::new();
        for (k, v) in parts {
            text.push_str(k);
            text.push('=');
            text.push_str(v.as_ref());
            text.push('\n');
        }
        CacheKey::from_text(text)
    }
    pub fn from_text(text: String) -> CacheKey {
        CacheKey { hash: fnv1a128_words(text.as_bytes()), text }
    }
    pub fn hash(&self) -> u128 {
        self.hash
    }
    /// 32 hex digits: the entry's file name.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.hash)
    }
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Where a cached value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheSource {
    Memory,
    Disk,
    Built,
}

impl std::fmt::Display for CacheSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheSource::Memory => "memory cache",
            CacheSource::Disk => "disk cache",
            CacheSource::Built => "compiled",
        })
    }
}

/// A freshly built value and the payload to store on disk (`None`: store nothing).
pub type Built<T> = (T, Option<Vec<u8>>);

/// Builds and decodes one kind of artifact.
pub trait Producer {
    type Output;
    type Error;
    /// Turns a disk entry's payload back into the value. An error discards the entry and
    /// the value is rebuilt (a stale or foreign payload is not fatal).
    fn decode(&self, payload: &[u8]) -> Result<Self::Output, String>;
    /// Builds the value from scratch, with the payload to store on disk (`None`: store
    /// nothing).
    fn build(&self) -> Result<Built<Self::Output>, Self::Error>;
}

/// Counters of one cache (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub memory_hits: u64,
    pub disk_hits: u64,
    pub builds: u64,
    /// Disk entries found corrupt (bad header, checksum, length, key) or undecodable,
    /// deleted and rebuilt.
    pub discarded: u64,
    pub write_errors: u64,
}

#[derive(Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    builds: AtomicU64,
    discarded: AtomicU64,
    write_errors: AtomicU64,
}

/// Where the cache keeps entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// `None`: memory only.
    pub disk_dir: Option<PathBuf>,
}

impl CacheConfig {
    /// `ATTNC_CACHE_DIR` if set (`off`, `none` or empty: no disk cache), else
    /// `$XDG_CACHE_HOME/attnc`, else `$HOME/.cache/attnc`, else memory only.
    pub fn from_env() -> CacheConfig {
        CacheConfig { disk_dir: dir_from(|k| std::env::var_os(k)) }
    }
    pub fn memory_only() -> CacheConfig {
        CacheConfig { disk_dir: None }
    }
    pub fn with_dir(dir: impl Into<PathBuf>) -> CacheConfig {
        CacheConfig { disk_dir: Some(dir.into()) }
    }
}

/// The default directory rule of [`CacheConfig::from_env`], over any environment.
pub fn dir_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(v) = env("ATTNC_CACHE_DIR") {
        let s = v.to_string_lossy();
        if s.is_empty() || s.eq_ignore_ascii_case("off") || s.eq_ignore_ascii_case("none") {
            return None;
        }
        return Some(PathBuf::from(v));
    }
    if let Some(x) = env("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("attnc"));
    }
    env("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache").join("attnc"))
}

type Slot<T> = Arc<Mutex<Option<(String, Arc<T>)>>>;

/// The memory + disk cache of one kind of artifact.
pub struct Cache<T> {
    mem: Mutex<HashMap<u128, Slot<T>>>,
    disk: Option<DiskStore>,
    disk_error: Option<String>,
    counters: Counters,
}

fn lock<M>(m: &Mutex<M>) -> MutexGuard<'_, M> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T> Cache<T> {
    /// A cache with the given disk directory (created if missing). When the directory
    /// cannot be created the cache works in memory only and [`Cache::disk_error`] says why.
    pub fn new(config: &CacheConfig) -> Cache<T> {
        let (disk, disk_error) = match &config.disk_dir {
            None => (None, None),
            Some(dir) => match DiskStore::new(dir) {
                Ok(d) => (Some(d), None),
                Err(e) => (None, Some(format!("disk cache disabled: cannot create {}: {e}", dir.display()))),
            },
        };
        Cache { mem: Mutex::new(HashMap::new()), disk, disk_error, counters: Counters::default() }
    }

    pub fn disk(&self) -> Option<&DiskStore> {
        self.disk.as_ref()
    }
    pub fn disk_error(&self) -> Option<&str> {
        self.disk_error.as_deref()
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            memory_hits: c.memory_hits.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
            builds: c.builds.load(Ordering::Relaxed),
            discarded: c.discarded.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
        }
    }

    /// Forgets every value held in memory (the disk stays).
    pub fn clear_memory(&self) {
        lock(&self.mem).clear();
    }

    /// Whether `key` would be served without a build: held in memory, or an entry on disk
    /// (not decoded: a corrupt entry counts, and is rebuilt when asked for). A value being
    /// built right now is not held yet.
    pub fn holds(&self, key: &CacheKey) -> bool {
        let slot = lock(&self.mem).get(&key.hash).cloned();
        let in_memory = slot.is_some_and(|slot| {
            slot.try_lock().is_ok_and(|guard| matches!(&*guard, Some((text, _)) if text == &key.text))
        });
        in_memory || self.disk.as_ref().is_some_and(|d| d.entry_path(key).is_file())
    }

    /// The value of `key`: from memory, from disk, or built by `producer` (once).
    pub fn get_or_build<P>(&self, key: &CacheKey, producer: &P) -> Result<(Arc<T>, CacheSource), P::Error>
    where
        P: Producer<Output = T>,
    {
        let slot = lock(&self.mem).entry(key.hash).or_default().clone();
        let mut guard = lock(&slot);
        let memory_ok = match &*guard {
            Some((text, v)) if text == &key.text => {
                self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
                return Ok((v.clone(), CacheSource::Memory));
            }
            // A 128-bit hash collision: serve neither from nor into this slot.
            Some(_) => false,
            None => true,
        };
        let (value, source) = self.lookup_disk_or_build(key, producer)?;
        let value = Arc::new(value);
        if memory_ok {
            *guard = Some((key.text.clone(), value.clone()));
        }
        Ok((value, source))
    }

    fn try_disk<P: Producer<Output = T>>(
        &self,
        disk: &DiskStore,
        key: &CacheKey,
        producer: &P,
        locked: bool,
    ) -> Option<T> {
        match disk.read(key) {
            DiskRead::Missing => None,
            DiskRead::Hit(payload) => match producer.decode(&payload) {
                Ok(v) => {
                    self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
                    Some(v)
                }
                Err(_) if locked => {
                    self.counters.discarded.fetch_add(1, Ordering::Relaxed);
                    disk.remove(key);
                    None
                }
                Err(_) => None,
            },
            DiskRead::Corrupt(_) => {
                // Delete only under the lock: unlocked, the file may be a fresh one that
                // another process renamed into place after our read.
                if locked {
                    self.counters.discarded.fetch_add(1, Ordering::Relaxed);
                    disk.remove(key);
                }
                None
            }
        }
    }

    fn lookup_disk_or_build<P: Producer<Output = T>>(
        &self,
        key: &CacheKey,
        producer: &P,
    ) -> Result<(T, CacheSource), P::Error> {
        let Some(disk) = &self.disk else {
            return self.build(None, key, producer).map(|v| (v, CacheSource::Built));
        };
        if let Some(v) = self.try_disk(disk, key, producer, false) {
            return Ok((v, CacheSource::Disk));
        }
        // Without the lock file (unwritable directory) build anyway: correctness does not
        // depend on the lock, only the build count across processes does.
        let _file_lock = disk.lock(key).ok();
        if let Some(v) = self.try_disk(disk, key, producer, true) {
            return Ok((v, CacheSource::Disk));
        }
        self.build(Some(disk), key, producer).map(|v| (v, CacheSource::Built))
    }

    fn build<P: Producer<Output = T>>(
        &self,
        disk: Option<&DiskStore>,
        key: &CacheKey,
        producer: &P,
    ) -> Result<T, P::Error> {
        let (value, payload) = producer.build()?;
        self.counters.builds.fetch_add(1, Ordering::Relaxed);
        if let (Some(disk), Some(payload)) = (disk, payload) {
            if disk.write(key, &payload).is_err() {
                self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(value)
    }
}

/// What reading one entry found.
#[derive(Debug, PartialEq, Eq)]
pub enum DiskRead {
    Missing,
    Hit(Vec<u8>),
    Corrupt(String),
}

/// The on-disk half of the cache: one file per key in one directory.
#[derive(Clone, Debug)]
pub struct DiskStore {
    dir: PathBuf,
}

impl DiskStore {
    pub fn new(dir: &Path) -> io::Result<DiskStore> {
        std::fs::create_dir_all(dir)?;
        Ok(DiskStore { dir: dir.to_path_buf() })
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.{ENTRY_EXT}", key.hex()))
    }
    pub fn lock_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.lock", key.hex()))
    }

    /// Reads and checks the entry of `key`.
    pub fn read(&self, key: &CacheKey) -> DiskRead {
        let mut bytes = Vec::new();
        match File::open(self.entry_path(key)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return DiskRead::Missing,
            Err(e) => return DiskRead::Corrupt(format!("cannot open: {e}")),
            Ok(mut f) => {
                if let Err(e) = f.read_to_end(&mut bytes) {
                    return DiskRead::Corrupt(format!("cannot read: {e}"));
                }
            }
        }
        match decode_entry(key, &bytes) {
            Ok(range) => {
                let payload = bytes[range].to_vec();
                DiskRead::Hit(payload)
            }
            Err(why) => DiskRead::Corrupt(why),
        }
    }

    /// Writes the entry of `key` atomically: readers see the old file or the whole new one.
    pub fn write(&self, key: &CacheKey, payload: &[u8]) -> io::Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!(".{}.{}.{n}.tmp", key.hex(), std::process::id()));
        let result = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(&encode_entry(key, payload))?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, self.entry_path(key))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Deletes the entry of `key` (best effort).
    pub fn remove(&self, key: &CacheKey) {
        let _ = std::fs::remove_file(self.entry_path(key));
    }

    /// Takes the key's cross-process lock (blocking); released when dropped.
    pub fn lock(&self, key: &CacheKey) -> io::Result<FileLock> {
        FileLock::acquire(&self.lock_path(key))
    }
}

/// An exclusive advisory lock on a file (`flock`), held until dropped. Lock files stay
/// in the directory: deleting them would let two processes lock different inodes.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    pub fn acquire(path: &Path) -> io::Result<FileLock> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            loop {
                // SAFETY: flock on a file descriptor this function owns.
                let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
                if rc == 0 {
                    break;
                }
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
        // Elsewhere: no cross-process exclusion (the in-process one still holds).
        Ok(FileLock { _file: file })
    }
}

/// The bytes of a disk entry.
pub fn encode_entry(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let text = key.text.as_bytes();
    let mut out = Vec::with_capacity(HEADER_LEN + text.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(&key.hash.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(text, payload).to_le_bytes());
    out.extend_from_slice(text);
    out.extend_from_slice(payload);
    out
}

fn checksum(text: &[u8], payload: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(16);
    buf.extend_from_slice(&fnv1a64(text).to_le_bytes());
    buf.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    fnv1a64(&buf)
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes)
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes)
}
fn le_u128(b: &[u8], at: usize) -> Option<u128> {
    b.get(at..at + 16).and_then(|s| s.try_into().ok()).map(u128::from_le_bytes)
}

/// Checks an entry's bytes against `key`; the payload's byte range when valid.
pub fn decode_entry(key: &CacheKey, bytes: &[u8]) -> Result<std::ops::Range<usize>, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("truncated header ({} bytes)", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("bad magic".into());
    }
    let field = |v: Option<u64>| v.ok_or_else(|| "truncated header".to_string());
    let version = field(le_u32(bytes, 8).map(u64::from))?;
    if version != u64::from(FORMAT_VERSION) {
        return Err(format!("format version {version}, expected {FORMAT_VERSION}"));
    }
    let text_len = field(le_u32(bytes, 12).map(u64::from))? as usize;
    let hash = le_u128(bytes, 16).ok_or("truncated header")?;
    let payload_len = field(le_u64(bytes, 32))?;
    let sum = field(le_u64(bytes, 40))?;
    if hash != key.hash {
        return Err("key hash differs".into());
    }
    let text_end = HEADER_LEN.checked_add(text_len).ok_or("bad key length")?;
    let expected_len =
        usize::try_from(payload_len).ok().and_then(|p| text_end.checked_add(p)).ok_or("bad payload length")?;
    if bytes.len() != expected_len {
        return Err(format!("length {} bytes, header says {expected_len}", bytes.len()));
    }
    let text = &bytes[HEADER_LEN..text_end];
    if text != key.text.as_bytes() {
        return Err("key text differs".into());
    }
    let payload = &bytes[text_end..];
    if checksum(text, payload) != sum {
        return Err("checksum mismatch".into());
    }
    Ok(text_end..bytes.len())
}

// ---------------------------------------------------------------------------------------
// Payload framing: named sections, for producers that store several blobs.

/// Packs named byte sections into one payload: `u32 count`, then per section `u32 name
/// length, name, u64 data length, data`.
pub fn pack_sections(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    for (name, data) in sections {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// The inverse of [`pack_sections`]; any inconsistency is an error, never a panic.
pub fn unpack_sections(payload: &[u8]) -> Result<Vec<(String, &[u8])>, String> {
    let count = le_u32(payload, 0).ok_or("no section count")? as usize;
    let mut at = 4usize;
    let mut out = Vec::new();
    for i in 0..count {
        let nl = le_u32(payload, at).ok_or_else(|| format!("section {i}: truncated"))? as usize;
        at += 4;
        let name = payload
            .get(at..at.checked_add(nl).ok_or("overflow")?)
            .ok_or_else(|| format!("section {i}: truncated name"))?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| format!("section {i}: name not UTF-8"))?;
        at += nl;
        let dl = le_u64(payload, at).ok_or_else(|| format!("section {name}: truncated"))?;
        at += 8;
        let dl = usize::try_from(dl).map_err(|_| format!("section {name}: too long"))?;
        let end = at.checked_add(dl).ok_or("overflow")?;
        let data = payload.get(at..end).ok_or_else(|| format!("section {name}: truncated data"))?;
        at = end;
        out.push((name, data));
    }
    if at != payload.len() {
        return Err(format!("{} trailing bytes", payload.len() - at));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A producer of strings that counts its builds (in memory and, optionally, in a
    /// file shared by processes) and can be slow, to widen races.
    struct Counting {
        value: String,
        builds: Arc<AtomicUsize>,
        log: Option<PathBuf>,
        delay: Duration,
    }

    impl Counting {
        fn new(value: &str) -> Counting {
            Counting { value: value.into(), builds: Arc::new(AtomicUsize::new(0)), log: None, delay: Duration::ZERO }
        }
    }

    impl Producer for Counting {
        type Output = String;
        type Error = String;
        fn decode(&self, payload: &[u8]) -> Result<String, String> {
            let s = String::from_utf8(payload.to_vec()).map_err(|e| e.to_string())?;
            if s.starts_with("undecodable") {
                return Err("producer rejects it".into());
            }
            Ok(s)
        }
        fn build(&self) -> Result<(String, Option<Vec<u8>>), String> {
            self.builds.fetch_add(1, Ordering::SeqCst);
            if let Some(log) = &self.log {
                let mut f = OpenOptions::new().create(true).append(true).open(log).map_err(|e| e.to_string())?;
                writeln!(f, "build by {}", std::process::id()).map_err(|e| e.to_string())?;
            }
            std::thread::sleep(self.delay);
            Ok((self.value.clone(), Some(self.value.clone().into_bytes())))
        }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "attnc-cache-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    fn key(s: &str) -> CacheKey {
        CacheKey::from_parts(&[("spec", s), ("arch", "sm_90a")])
    }

    #[test]
    fn memory_then_disk_then_build() {
        let dir = tmpdir("levels");
        let p = Counting::new("artifact");
        let c: Cache<String> = Cache::new(&CacheConfig::with_dir(&dir));
        let (v, s) = c.get_or_build(&key("a"), &p).expect("build");
        assert_eq!((v.as_str(), s), ("artifact", CacheSource::Built));
        let (_, s) = c.get_or_build(&key("a"), &p).expect("hit");
        assert_eq!(s, CacheSource::Memory);
        // A fresh cache on the same directory: a disk hit, no build.
        let c2: Cache<String> = Cache::new(&CacheConfig::with_dir(&dir));
        let (v, s) = c2.get_or_build(&key("a"), &p).expect("disk");
        assert_eq!((v.as_str(), s), ("artifact", CacheSource::Disk));
        assert_eq!(p.builds.load(Ordering::SeqCst), 1);
        assert_eq!(c2.stats(), CacheStats { disk_hits: 1, ..Default::default() });
        // clear_memory goes back to disk.
        c2.clear_memory();
        assert_eq!(c2.get_or_build(&key("a"), &p).expect("disk").1, CacheSource::Disk);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `holds`: what a `get_or_build` would serve without building — memory, then disk;
    /// never a slot whose build is still running.
    #[test]
    fn holds_what_is_served_without_a_build() {
        let dir = tmpdir("holds");
        let c: Cache<String> = Cache::new(&CacheConfig::with_dir(&dir));
        assert!(!c.holds(&key("h")));
        c.get_or_build(&key("h"), &Counting::new("v")).expect("build");
        assert!(c.holds(&key("h")));
        c.clear_memory();
        assert!(c.holds(&key("h")), "on disk");
        let mem: Cache<String> = Cache::new(&CacheConfig::memory_only());
        assert!(!mem.holds(&key("h")));
        let mem = Arc::new(mem);
        let slow = Arc::new(Counting { delay: Duration::from_millis(300), ..Counting::new("slow") });
        let building = {
            let (mem, slow) = (mem.clone(), slow.clone());
            std::thread::spawn(move || mem.get_or_build(&key("s"), &*slow).map(|_| ()))
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!mem.holds(&key("s")), "still building");
        building.join().expect("thread").expect("build");
        assert!(mem.holds(&key("s")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn memory_only_config_never_touches_disk() {
        let p = Counting::new("x");
        let c: Cache<String> = Cache::new(&CacheConfig::memory_only());
        assert!(c.disk().is_none());
        assert_eq!(c.get_or_build(&key("m"), &p).expect("b").1, CacheSource::Built);
        assert_eq!(c.get_or_build(&key("m"), &p).expect("b").1, CacheSource::Memory);
        let c2: Cache<String> = Cache::new(&CacheConfig::memory_only());
        assert_eq!(c2.get_or_build(&key("m"), &p).expect("b").1, CacheSource::Built);
    }

    #[test]
    fn unusable_dir_falls_back_to_memory() {
        let dir = tmpdir("unusable");
        let file = dir.join("not-a-dir");
        std::fs::write(&file, b"x").expect("write");
        let c: Cache<String> = Cache::new(&CacheConfig::with_dir(file.join("sub")));
        assert!(c.disk().is_none());
        assert!(c.disk_error().is_some_and(|e| e.contains("disk cache disabled")));
        let p = Counting::new("v");
        assert_eq!(c.get_or_build(&key("u"), &p).expect("b").0.as_str(), "v");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn build_errors_are_returned_and_not_cached() {
        struct Failing(AtomicUsize);
        impl Producer for Failing {
            type Output = String;
            type Error = String;
            fn decode(&self, _: &[u8]) -> Result<String, String> {
                Err("no".into())
            }
            fn build(&self) -> Result<(String, Option<Vec<u8>>), String> {
                self.0.fetch_add(1, Ordering::SeqCst);
                Err("lowering failed".into())
            }
        }
        let dir = tmpdir("fail");
        let c: Cache<String> = Cache::new(&CacheConfig::with_dir(&dir));
        let f = Failing(AtomicUsize::new(0));
        assert_eq!(c.get_or_build(&key("f"), &f).map(|_| ()), Err("lowering failed".to_string()));
        assert_eq!(c.get_or_build(&key("f"), &f).map(|_| ()), Err("lowering failed".to_string()));
        assert_eq!(f.0.load(Ordering::SeqCst), 2);
        assert!(!DiskStore::new(&dir).expect("d").entry_path(&key("f")).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn many_threads_same_key_build_once() {
        let dir = tmpdir("threads");
        let c: Arc<Cache<String>> = Arc::new(Cache::new(&CacheConfig::with_dir(&dir)));
        let mut p = Counting::new("shared");
        p.delay = Duration::from_millis(100);
        let p = Arc::new(p);
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let (c, p) = (c.clone(), p.clone());
                std::thread::spawn(move || c.get_or_build(&key("t"), &*p).map(|(v, s)| (v.to_string(), s)))
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("join").expect("ok")).collect();
        assert!(results.iter().all(|(v, _)| v == "shared"));
        assert_eq!(p.builds.load(Ordering::SeqCst), 1);
        assert_eq!(results.iter().filter(|r| r.1 == CacheSource::Built).count(), 1);
        let st = c.stats();
        assert_eq!((st.builds, st.memory_hits), (1, 15));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn different_keys_do_not_serialize() {
        let c: Arc<Cache<String>> = Arc::new(Cache::new(&CacheConfig::memory_only()));
        let start = std::time::Instant::now();
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut p = Counting::new("v");
                    p.delay = Duration::from_millis(200);
                    c.get_or_build(&key(&format!("k{i}")), &p).map(|_| ())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("join").expect("ok");
        }
        assert!(start.elapsed() < Duration::from_millis(700), "{:?}", start.elapsed());
    }

    #[test]
    fn key_sensitivity() {
        let a = CacheKey::from_parts(&[("spec", "x"), ("arch", "sm_90a")]);
        assert_eq!(a, CacheKey::from_parts(&[("spec", "x"), ("arch", "sm_90a")]));
        for other in [
            CacheKey::from_parts(&[("spec", "y"), ("arch", "sm_90a")]),
            CacheKey::from_parts(&[("spec", "x"), ("arch", "sm_80")]),
            CacheKey::from_parts(&[("spec", "x"), ("arch", "sm_90a"), ("llvm", "22.1.0")]),
            CacheKey::from_parts(&[("spec", "x\narch=sm_90a"), ("", "")]),
        ] {
            assert_ne!(a.hash(), other.hash(), "{:?}", other.text());
        }
        assert_eq!(a.hex().len(), 32);
    }

    /// Every corruption of an entry is detected, the entry deleted and rebuilt.
    #[test]
    fn corrupt_entries_are_discarded_and_rebuilt() {
        let dir = tmpdir("corrupt");
        let k = key("c");
        let store = DiskStore::new(&dir).expect("store");
        let payload = b"the artifact bytes".to_vec();
        let good = encode_entry(&k, &payload);
        assert_eq!(decode_entry(&k, &good).map(|r| good[r].to_vec()), Ok(payload.clone()));

        let mut variants: Vec<(String, Vec<u8>)> = Vec::new();
        for cut in [0, 1, 7, HEADER_LEN - 1, HEADER_LEN, HEADER_LEN + 3, good.len() - 1] {
            variants.push((format!("truncated to {cut}"), good[..cut].to_vec()));
        }
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x40;
            variants.push((format!("byte {i} flipped"), b));
        }
        let mut longer = good.clone();
        longer.push(0);
        variants.push(("trailing byte".into(), longer));
        // A valid entry, but of another key.
        variants.push(("other key".into(), encode_entry(&key("other"), &payload)));
        for (what, bytes) in &variants {
            assert!(decode_entry(&k, bytes).is_err(), "{what} not detected");
        }

        let p = Counting::new("rebuilt");
        for (what, bytes) in variants.iter().step_by(7) {
            std::fs::write(store.entry_path(&k), bytes).expect("write");
            assert!(matches!(store.read(&k), DiskRead::Corrupt(_)), "{what}");
            let c: Cache<String> = Cache::new(&CacheConfig::with_dir(&dir));
            let (v, s) = c.get_or_build(&k, &p).expect("rebuild");
            assert_eq!((v.as_str(), s), ("rebuilt", CacheSource::Built), "{what}");
            assert_eq!(c.stats().discarded, 1, "{what}");
            // The rebuilt entry replaced the corrupt one.
            assert_eq!(store.read(&k), DiskRead::Hit(b"rebuilt".to_vec()), "{what}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn undecodable_payload_is_discarded() {
        let dir = tmpdir("undecodable");
        let k = key("d");
        let store = DiskStore::new(&dir).expect("store");
        store.write(&k, b"undecodable payload").expect("write");
        let c: Cache<String> = Cache::new(&CacheConfig::with_dir(&dir));
        let p = Counting::new("good");
        assert_eq!(c.get_or_build(&k, &p).expect("ok").1, CacheSource::Built);
        assert_eq!(c.stats().discarded, 1);
        assert_eq!(store.read(&k), DiskRead::Hit(b"good".to_vec()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writes_are_atomic_and_leave_no_temp_files() {
        let dir = tmpdir("atomic");
        let store = DiskStore::new(&dir).expect("store");
        let k = key("w");
        for i in 0..5 {
            store.write(&k, format!("v{i}").as_bytes()).expect("write");
        }
        assert_eq!(store.read(&k), DiskRead::Hit(b"v4".to_vec()));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![format!("{}.{ENTRY_EXT}", k.hex())]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sections_round_trip_and_reject_garbage() {
        let p = pack_sections(&[("meta", b"{}"), ("ptx", b"PTX"), ("cubin", b"")]);
        let s = unpack_sections(&p).expect("unpack");
        assert_eq!(s.len(), 3);
        assert_eq!((s[1].0.as_str(), s[1].1), ("ptx", &b"PTX"[..]));
        for cut in 0..p.len() {
            assert!(unpack_sections(&p[..cut]).is_err(), "cut {cut}");
        }
        assert!(unpack_sections(&[0xff, 0xff, 0xff, 0xff, 1, 2]).is_err());
    }

    #[test]
    fn env_dir_rule() {
        use std::ffi::OsString;
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| OsString::from(p.1))
        };
        assert_eq!(dir_from(env(&[("ATTNC_CACHE_DIR", "/x"), ("HOME", "/h")])), Some(PathBuf::from("/x")));
        assert_eq!(dir_from(env(&[("ATTNC_CACHE_DIR", "off"), ("HOME", "/h")])), None);
        assert_eq!(dir_from(env(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/h")])), Some(PathBuf::from("/c/attnc")));
        assert_eq!(dir_from(env(&[("HOME", "/h")])), Some(PathBuf::from("/h/.cache/attnc")));
        assert_eq!(dir_from(env(&[])), None);
    }

    const CHILD_ENV: &str = "ATTNC_CACHE_TEST_CHILD_DIR";

    /// The child half of `processes_same_key_build_once`: does nothing unless started
    /// by it (with `CHILD_ENV` set).
    #[test]
    fn child_process_helper() {
        let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
        let dir = PathBuf::from(dir);
        let mut p = Counting::new("from some process");
        p.log = Some(dir.join("builds.log"));
        p.delay = Duration::from_millis(300);
        let c: Cache<String> = Cache::new(&CacheConfig::with_dir(dir.join("cache")));
        let (v, _) = c.get_or_build(&key("proc"), &p).expect("child get");
        assert_eq!(v.as_str(), "from some process");
    }

    #[test]
    fn processes_same_key_build_once() {
        let dir = tmpdir("procs");
        let exe = std::env::current_exe().expect("test binary");
        let children: Vec<_> = (0..4)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args(["--exact", "cache::tests::child_process_helper", "--test-threads=1"])
                    .env(CHILD_ENV, &dir)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("spawn child")
            })
            .collect();
        for mut ch in children {
            assert!(ch.wait().expect("wait").success(), "a child failed");
        }
        let log = std::fs::read_to_string(dir.join("builds.log")).expect("log");
        assert_eq!(log.lines().count(), 1, "builds: {log}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
