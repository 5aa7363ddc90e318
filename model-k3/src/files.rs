//! Reading and writing files safely: readers accept regular files only (a FIFO would block
//! forever, `/dev/zero` never ends, a directory is not data) and read at most a stated number of
//! bytes; writers only ever replace a regular file, through a temporary file in the same
//! directory renamed into place, so a device node, FIFO or directory named as an output is never
//! replaced and a reader never sees a half-written file.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a non-regular file is, for messages.
fn kind(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "a directory";
    }
    if t.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

fn not_regular(m: &Metadata, doing: &str) -> io::Error {
    let k = kind(m);
    let kind = if m.is_dir() { io::ErrorKind::IsADirectory } else { io::ErrorKind::InvalidInput };
    io::Error::new(kind, format!("is {k}, not a regular file; {doing}"))
}

/// Opens a regular file for reading. Anything else is refused before it is opened (opening a
/// FIFO blocks until a writer appears), and checked again on the open handle, which is opened
/// non-blocking so that a FIFO swapped in between cannot block either.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let m = std::fs::metadata(path)?;
    if !m.is_file() {
        return Err(not_regular(&m, "refusing to read it"));
    }
    let mut opts = File::options();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let f = opts.open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(not_regular(&m, "refusing to read it"));
    }
    Ok(f)
}

/// Reads a whole regular file of at most `limit` bytes (`limit_name` names the documented
/// limit in the error).
pub fn read_capped(path: &Path, limit: u64, limit_name: &str) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata()?.len();
    let too_big = |n: u64| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{n} bytes, over the limit of {limit} bytes for this file ({limit_name})"))
    };
    if len > limit {
        return Err(too_big(len));
    }
    let mut buf = Vec::with_capacity(len as usize);
    // The file may grow after the size was read: never read past the limit.
    f.take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(too_big(buf.len() as u64));
    }
    Ok(buf)
}

/// As [`read_capped`], as UTF-8 text.
pub fn read_text_capped(path: &Path, limit: u64, limit_name: &str) -> io::Result<String> {
    let bytes = read_capped(path, limit, limit_name)?;
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")))
}

/// Reads a whole regular file (no size limit: its size is known and it is read exactly).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata()?.len();
    let mut buf = Vec::new();
    buf.try_reserve_exact(len as usize)
        .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, format!("{len} bytes do not fit in memory: {e}")))?;
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The file an output path will replace: the path itself, or the target of a symbolic link to
/// a regular file. Anything that exists and is not a regular file is refused.
fn output_target(path: &Path) -> io::Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(path.to_path_buf()),
        Err(e) => Err(e),
        Ok(m) if m.is_file() => Ok(path.to_path_buf()),
        Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(path) {
            Ok(t) if t.is_file() => std::fs::canonicalize(path),
            Ok(t) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("is a symbolic link to {}, not to a regular file; refusing to replace it", kind(&t)),
            )),
            Err(e) => Err(io::Error::new(e.kind(), format!("is a symbolic link whose target cannot be read ({e}); refusing to write through it"))),
        },
        Ok(m) => Err(not_regular(&m, "refusing to replace it")),
    }
}

/// Checks, before any work is done, that `path` may be written by [`write_replacing`].
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    output_target(path).map(|_| ())
}

/// The start of every temporary name made for `target`: `.NAME.k3-`.
pub(crate) fn temp_prefix(target: &Path) -> String {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!(".{name}.k3-")
}

/// A sibling name of `target` no other writer uses: `.NAME.k3-TAG-PID-N`.
pub(crate) fn temp_sibling(target: &Path, tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    target.with_file_name(format!("{}{tag}-{}-{n}", temp_prefix(target), std::process::id()))
}

/// Writes `path` through `write(tmp)`, which must write the whole content to the temporary path
/// it is given; the file is then synced and renamed over `path`. `path` may be missing, a regular
/// file, or a symbolic link to one (its target is replaced); anything else is refused before
/// anything is written.
pub fn write_replacing<E>(path: &Path, write: impl FnOnce(&Path) -> Result<(), E>, io_err: impl Fn(io::Error) -> E) -> Result<(), E> {
    let target = output_target(path).map_err(&io_err)?;
    let tmp = temp_sibling(&target, "tmp");
    // Claim the name (create_new fails rather than reuse anything already there).
    std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(&io_err)?;
    let done = write(&tmp).and_then(|()| {
        File::options().write(true).open(&tmp).and_then(|f| f.sync_all()).map_err(&io_err)?;
        std::fs::rename(&tmp, &target).map_err(&io_err)
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// [`write_replacing`] with bytes in memory.
pub fn write_bytes_replacing(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_replacing(path, |tmp| std::fs::write(tmp, bytes), |e| e)
}
