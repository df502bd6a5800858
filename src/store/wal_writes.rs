//! One write per commit to SQLite's WAL: a VFS over SQLite's default
//! (`unix`) that holds the frames a transaction writes to its WAL and
//! hands them to the operating system in one `pwrite` (per 128 KiB) when
//! SQLite syncs the WAL, instead of two per frame (a 24-byte header, then
//! the page).
//!
//! Why: a job's create writes about 15 frames and its finish 10, so a lone
//! job made about 50 `pwrite` calls and a job at C=32 about 16 (strace
//! and `perf stat -e syscalls:sys_enter_pwrite64` on the server), each a
//! system call with the file's lock and page-cache work: about a third of
//! the server's CPU on a job was the kernel's.
//!
//! Why it is safe: every connection that opens a file through this VFS
//! runs with `synchronous = FULL` (`sqlite.rs`, `open_conn`), where SQLite
//! syncs the WAL after a commit's frames and before it makes them visible
//! (`sqlite3WalFrames` writes the frames, calls `xSync`, and only then
//! writes the wal-index header that readers and recovery go by). So:
//!
//! - what waits here has not been synced, and no reader has been told of
//!   it; it reaches the file before `xSync` asks the disk to keep it, so
//!   what the disk keeps, and when, is what it was;
//! - anything that may look at the file (a read, its size, a truncate, a
//!   file control, closing it) writes what waits first, so the file is
//!   never seen other than as it would have been;
//! - a write that does not continue or overwrite what waits writes it
//!   first, and more than [`MAX_WAITING`] bytes are written at once (a
//!   large transaction whose pages spill before its commit).
//!
//! Only the WAL is wrapped: the database file, journals and temporary
//! files keep SQLite's own file, methods and all.
//!
//! This is the crate's one module with `unsafe` code: a VFS is a table of C
//! functions over raw pointers, and this one hands most calls on to
//! SQLite's own, which rusqlite's safe API does not reach.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name the VFS is registered under, given to `open_with_flags_and_vfs`.
pub const NAME: &str = "onejob-wal";
const NAME_C: &CStr = c"onejob-wal";

/// Bytes held before they are written regardless: far above a commit of
/// the job path (15 frames of 2 KiB), far below what would matter in memory.
const MAX_WAITING: usize = 1 << 20;

/// The most SQLite's unix file writes in one call (`seekAndWriteFd` keeps
/// the low 17 bits of the length): longer runs go in pieces of this size.
const MAX_WRITE: usize = 0x1ffff;

/// Register the VFS (once; later calls return at once).
pub fn register() -> Result<(), rusqlite::Error> {
    static REGISTERED: OnceLock<Result<(), c_int>> = OnceLock::new();
    let result = *REGISTERED.get_or_init(|| unsafe {
        // Initialise SQLite (a no-op once done) before asking for its VFS.
        let rc = ffi::sqlite3_initialize();
        if rc != ffi::SQLITE_OK {
            return Err(rc);
        }
        let real = ffi::sqlite3_vfs_find(std::ptr::null());
        if real.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        let tail_at = ((*real).szOsFile as usize).next_multiple_of(std::mem::align_of::<Tail>());
        TAIL_AT.store(tail_at, std::sync::atomic::Ordering::Relaxed);
        let _ = UNDER.set(Under(real));
        // Everything as the default's, but for the name, the size of a file
        // (the default's, then our `Tail`) and how a file is opened.
        let mut vfs = *real;
        vfs.pNext = std::ptr::null_mut();
        vfs.zName = NAME_C.as_ptr();
        vfs.szOsFile = (tail_at + std::mem::size_of::<Tail>()) as c_int;
        vfs.xOpen = Some(open);
        let rc = ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0);
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(rc)
        }
    });
    result.map_err(|rc| rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None))
}

/// SQLite's default VFS, which opens every file of ours.
struct Under(*mut ffi::sqlite3_vfs);
// The default VFS is a static of SQLite's, never freed, safe from any thread.
unsafe impl Send for Under {}
unsafe impl Sync for Under {}
static UNDER: OnceLock<Under> = OnceLock::new();
/// Where in a file of ours the `Tail` begins: after the default's file,
/// aligned. Set before the VFS is registered, so before any file opens.
static TAIL_AT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What follows SQLite's own file in a WAL opened here.
struct Tail {
    /// The methods SQLite's VFS gave the file, which do the work.
    methods: *const ffi::sqlite3_io_methods,
    /// Where the bytes waiting to be written go, and the bytes.
    start: i64,
    waiting: Vec<u8>,
}

#[cfg(test)]
thread_local! {
    /// Writes handed to the operating system's file on this thread.
    static WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Where the `Tail` of `file` is (written by `open`, for a WAL only).
unsafe fn tail_ptr(file: *mut ffi::sqlite3_file) -> *mut Tail {
    let at = TAIL_AT.load(std::sync::atomic::Ordering::Relaxed);
    file.cast::<u8>().add(at).cast::<Tail>()
}

/// The `Tail` of a WAL `open` wrapped.
unsafe fn tail<'a>(file: *mut ffi::sqlite3_file) -> &'a mut Tail {
    &mut *tail_ptr(file)
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(Under(under)) = UNDER.get() else {
        return ffi::SQLITE_ERROR;
    };
    let Some(under_open) = (**under).xOpen else {
        return ffi::SQLITE_ERROR;
    };
    let rc = under_open(*under, name, file, flags, out_flags);
    if rc != ffi::SQLITE_OK || flags & ffi::SQLITE_OPEN_WAL == 0 || (*file).pMethods.is_null() {
        return rc;
    }
    let methods = (*file).pMethods;
    std::ptr::write(
        tail_ptr(file),
        Tail {
            methods,
            start: 0,
            waiting: Vec::new(),
        },
    );
    (*file).pMethods = &WAL_METHODS;
    rc
}

/// Write what waits, if anything; what was held is dropped either way
/// (after a failed write SQLite rolls the transaction back).
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    let tail = tail(file);
    if tail.waiting.is_empty() {
        return ffi::SQLITE_OK;
    }
    let Some(write) = (*tail.methods).xWrite else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let mut rc = ffi::SQLITE_OK;
    let mut at = tail.start;
    for piece in tail.waiting.chunks(MAX_WRITE) {
        #[cfg(test)]
        WRITES.with(|writes| writes.set(writes.get() + 1));
        // A piece is at most `MAX_WRITE` bytes: it fits.
        rc = write(file, piece.as_ptr().cast(), piece.len() as c_int, at);
        if rc != ffi::SQLITE_OK {
            break;
        }
        at += piece.len() as i64;
    }
    tail.waiting.clear();
    rc
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len);
    let tail = tail(file);
    let end = tail.start + tail.waiting.len() as i64;
    if !tail.waiting.is_empty() && offset >= tail.start && offset <= end {
        // Continues what waits, or overwrites part of it (a page written
        // twice in one transaction) and perhaps continues past it.
        let at = (offset - tail.start) as usize;
        let over = bytes.len().min(tail.waiting.len() - at);
        tail.waiting[at..at + over].copy_from_slice(&bytes[..over]);
        tail.waiting.extend_from_slice(&bytes[over..]);
    } else {
        let rc = flush(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let tail = self::tail(file);
        tail.start = offset;
        tail.waiting.extend_from_slice(bytes);
    }
    if self::tail(file).waiting.len() >= MAX_WAITING {
        return flush(file);
    }
    ffi::SQLITE_OK
}

/// The method SQLite's file has for `$field`, called after what waits is
/// written (`flush`) or at once.
macro_rules! forward {
    (flush, $file:ident, $field:ident ( $($arg:expr),* )) => {{
        let rc = flush($file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        forward!(now, $file, $field($($arg),*))
    }};
    (now, $file:ident, $field:ident ( $($arg:expr),* )) => {{
        match (*tail($file).methods).$field {
            Some(method) => method($file $(, $arg)*),
            None => ffi::SQLITE_IOERR,
        }
    }};
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    let flushed = flush(file);
    let methods = tail(file).methods;
    std::ptr::drop_in_place(tail_ptr(file));
    let closed = match (*methods).xClose {
        Some(close) => close(file),
        None => ffi::SQLITE_OK,
    };
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        closed
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    forward!(flush, file, xRead(data, amount, offset))
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    forward!(flush, file, xTruncate(size))
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    forward!(flush, file, xSync(flags))
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    forward!(flush, file, xFileSize(size))
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(now, file, xLock(level))
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(now, file, xUnlock(level))
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward!(now, file, xCheckReservedLock(out))
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    forward!(flush, file, xFileControl(op, arg))
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    match (*tail(file).methods).xSectorSize {
        Some(method) => method(file),
        None => 4096,
    }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    match (*tail(file).methods).xDeviceCharacteristics {
        Some(method) => method(file),
        None => 0,
    }
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(now, file, xShmMap(region, size, extend, out))
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    forward!(now, file, xShmLock(offset, n, flags))
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    if let Some(method) = (*tail(file).methods).xShmBarrier {
        method(file);
    }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward!(now, file, xShmUnmap(delete))
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(flush, file, xFetch(offset, amount, out))
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    page: *mut c_void,
) -> c_int {
    forward!(now, file, xUnfetch(offset, page))
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn writes() -> u64 {
        WRITES.with(std::cell::Cell::get)
    }

    fn open(path: &std::path::Path) -> Connection {
        register().unwrap();
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), NAME).unwrap();
        conn.execute_batch(
            "PRAGMA page_size = 2048; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;",
        )
        .unwrap();
        conn
    }

    /// `t`'s rows and the sum of their bodies as numbers, read on SQLite's
    /// own VFS, after `PRAGMA integrity_check` says the file is whole.
    fn rows_and_sum(conn: &Connection) -> (i64, i64) {
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        conn.query_row(
            "SELECT COUNT(*), SUM(CAST(body AS INTEGER)) FROM t",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    }

    /// A copy of `dir/t.db` and its WAL without the wal-index, opened on
    /// SQLite's own VFS: SQLite rebuilds the index from the WAL's bytes, as
    /// after a crash. `conn` (the writer) is closed after the copy.
    fn recovered_copy(dir: &std::path::Path, conn: Connection) -> Connection {
        let copy = dir.join("copy.db");
        std::fs::copy(dir.join("t.db"), &copy).unwrap();
        std::fs::copy(dir.join("t.db-wal"), dir.join("copy.db-wal")).unwrap();
        drop(conn);
        Connection::open(&copy).unwrap()
    }

    #[test]
    fn a_commit_of_many_pages_is_one_write_and_every_byte_arrives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = open(&path);
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL); CREATE INDEX t_body ON t (body);")
            .unwrap();
        let wal_len = || {
            std::fs::metadata(dir.path().join("t.db-wal"))
                .unwrap()
                .len()
        };
        let (before, wal_before) = (writes(), wal_len());
        conn.execute_batch(
            "BEGIN; WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < 200) \
             INSERT INTO t (body) SELECT printf('%0500d', v) FROM n; COMMIT;",
        )
        .unwrap();
        let bytes = wal_len() - wal_before;
        let frames = bytes / (2048 + 24);
        assert!(frames > 60, "the transaction wrote {frames} frames");
        let pieces = bytes.div_ceil(MAX_WRITE as u64);
        assert_eq!(
            writes() - before,
            pieces,
            "{frames} frames in {pieces} writes"
        );

        // Another connection, on SQLite's own VFS, reads what was committed.
        let other = Connection::open(&path).unwrap();
        assert_eq!(rows_and_sum(&other), (200, 200 * 201 / 2));
    }

    #[test]
    fn pages_spilled_and_written_again_in_one_transaction_are_on_disk_as_committed() {
        // A cache of a few pages makes SQLite write pages to the WAL before
        // the commit, then write some of them again (overwriting their
        // frames, then reading them back for their checksums).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = open(&path);
        conn.execute_batch(
            "PRAGMA cache_size = 4; CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL); \
             BEGIN; WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < 3000) \
             INSERT INTO t (body) SELECT printf('%0300d', v) FROM n; \
             UPDATE t SET body = printf('%0300d', id * 2) WHERE id % 7 = 0; COMMIT;",
        )
        .unwrap();
        let other = recovered_copy(dir.path(), conn);
        let multiples_of_7: i64 = (1..=3000).filter(|v| v % 7 == 0).sum();
        assert_eq!(
            rows_and_sum(&other),
            (3000, 3000 * 3001 / 2 + multiples_of_7)
        );
    }

    #[test]
    fn commits_after_a_checkpoint_restarts_the_wal_land_at_its_start() {
        // A checkpoint that restarts the WAL makes the next commit write
        // from its first frame again: a write before what waits, which
        // must reach the file on its own.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = open(&path);
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .unwrap();
        for round in 0..3 {
            conn.execute_batch(
                "BEGIN; WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < 100) \
                 INSERT INTO t (body) SELECT printf('%0400d', v) FROM n; COMMIT;",
            )
            .unwrap();
            if round < 2 {
                let busy: i64 = conn
                    .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get(0))
                    .unwrap();
                assert_eq!(busy, 0, "the checkpoint ran");
            }
        }
        let other = recovered_copy(dir.path(), conn);
        assert_eq!(rows_and_sum(&other), (300, 3 * 100 * 101 / 2));
    }
}
