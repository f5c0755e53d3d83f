//! The worker socket as it is bound and published: its final mode from the start, stale files
//! replaced and live ones refused, nothing another user planted followed or removed, paths too
//! long for a worker to connect to refused.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use std::os::unix::fs::PermissionsExt;

use super::*;

/// A fresh directory for one test (removed when dropped).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("corral-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn os_error(code: i32) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(code))
}

#[test]
fn only_a_refused_connection_makes_a_socket_file_stale() {
    assert!(matches!(existing(Ok(())), Existing::Live));
    assert!(matches!(existing(os_error(libc::ECONNREFUSED)), Existing::Stale));
    assert!(matches!(existing(os_error(libc::ENOENT)), Existing::Gone));
    // A live proxy whose backlog is full, a socket we may not use, anything else: cannot tell.
    for code in [libc::EAGAIN, libc::EACCES, libc::EPERM, libc::ETIMEDOUT] {
        assert!(matches!(existing(os_error(code)), Existing::Unknown(_)), "errno {code}");
    }
}

/// Watches `dir` for entries created, moved in, or whose metadata changes (IN_ATTRIB: a chmod).
fn watch(dir: &Path) -> libc::c_int {
    let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: plain system calls; `path` outlives them.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        assert!(fd >= 0);
        let mask = libc::IN_CREATE | libc::IN_ATTRIB | libc::IN_MOVED_TO;
        assert!(libc::inotify_add_watch(fd, path.as_ptr(), mask) >= 0);
        fd
    }
}

/// The events queued on `fd` for entries named `name`, in order.
fn events_for(fd: libc::c_int, name: &str) -> Vec<u32> {
    let mut buffer = vec![0u8; 64 * 1024];
    // SAFETY: the kernel writes at most the buffer's length.
    let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
    // SAFETY: closing the descriptor `watch` opened.
    unsafe { libc::close(fd) };
    let read = usize::try_from(read).unwrap_or(0);
    let header = std::mem::size_of::<libc::inotify_event>();
    let (mut at, mut masks) = (0, Vec::new());
    while at + header <= read {
        // SAFETY: the kernel wrote a whole event header here; read_unaligned copes with alignment.
        let event: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buffer[at..].as_ptr().cast()) };
        let raw = &buffer[at + header..at + header + event.len as usize];
        let entry = raw.split(|&b| b == 0).next().unwrap_or_default();
        if entry == name.as_bytes() {
            masks.push(event.mask);
        }
        at += header + event.len as usize;
    }
    masks
}

#[tokio::test]
async fn the_socket_appears_with_its_final_mode_and_is_never_changed_in_place() {
    let scratch = Scratch::new("mode");
    let path = scratch.0.join("corral.sock");
    let events = watch(&scratch.0);
    let _listener = bind(&path, 0o600).await.unwrap();
    // Created once (linked into place) and never chmodded there: it never had another mode.
    assert_eq!(events_for(events, "corral.sock"), [libc::IN_CREATE]);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    // And nothing is left beside it.
    let names: Vec<_> =
        std::fs::read_dir(&scratch.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["corral.sock"]);
    UnixStream::connect(&path).await.expect("it listens");
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
    let scratch = Scratch::new("stale");
    let path = scratch.0.join("corral.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // the file stays, nobody listens
    let live = bind(&path, 0o600).await.expect("a stale socket is replaced");
    let again = bind(&path, 0o600).await.expect_err("a live socket is never replaced");
    assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
    drop(live);
}

#[tokio::test]
async fn what_another_user_plants_beside_the_socket_is_never_followed_nor_removed() {
    let scratch = Scratch::new("planted");
    let victim = scratch.0.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("s"), b"keep").unwrap();
    // The private directory's name was the pid alone: a symlink planted there had Corral delete
    // the file `s` it led to. Its name is random now, and nothing found is touched.
    let planted = scratch.0.join(format!(".corral-{}", std::process::id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let path = scratch.0.join("corral.sock");
    let (_listener, _socket) = bind(&path, 0o600).await.unwrap();
    assert_eq!(std::fs::read(victim.join("s")).unwrap(), b"keep");
    assert!(std::fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
    // And the private directory Corral made is gone, leaving the socket, the victim, the plant.
    let mut names: Vec<_> =
        std::fs::read_dir(&scratch.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    let planted_name = planted.file_name().unwrap().to_owned();
    assert_eq!(names, [planted_name, "corral.sock".into(), "victim".into()]);
}

#[tokio::test]
async fn a_file_that_appears_while_binding_is_never_replaced() {
    let scratch = Scratch::new("race");
    let path = scratch.0.join("corral.sock");
    std::fs::write(&path, b"not ours").unwrap();
    // As if it appeared after the stale check: publishing must not replace it.
    let refused = publish(&path, 0o600).expect_err("an existing file is never replaced");
    assert_eq!(refused.kind(), io::ErrorKind::AddrInUse);
    assert_eq!(std::fs::read(&path).unwrap(), b"not ours");
}

#[tokio::test]
async fn a_path_that_cannot_be_a_socket_is_refused_naming_the_operator_s_own_path() {
    // The error had named the private directory Corral binds in (`.corral-PID-TAG`), which the
    // operator never wrote, or (for a trailing slash) no path at all.
    let scratch = Scratch::new("where");
    let missing = scratch.0.join("nowhere").join("w.sock");
    let refused = bind(&missing, 0o600).await.expect_err("no such directory");
    let said = refused.to_string();
    let parent = scratch.0.join("nowhere");
    assert!(said.contains(&format!("the directory {} does not exist", parent.display())), "{said}");
    assert!(!said.contains(".corral-"), "{said}");
    let slashed = PathBuf::from(format!("{}/w.sock/", scratch.0.display()));
    let refused = bind(&slashed, 0o600).await.expect_err("a directory's form");
    assert!(refused.to_string().contains("ends in `/`"), "{refused}");
}

#[tokio::test]
async fn a_path_too_long_for_a_worker_to_connect_to_is_refused() {
    let scratch = Scratch::new("long");
    let path = scratch.0.join("x".repeat(108));
    let refused = bind(&path, 0o600).await.expect_err("no worker could connect to it");
    assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
    assert!(refused.to_string().contains("at most 107"), "{refused}");
    assert!(!path.exists());
    // A path that fits, in a directory where the private one beside it would not: bound through
    // /proc (its path short whatever the directory's), it serves.
    let room = MAX_PATH_BYTES - scratch.0.as_os_str().len() - "/c.sock".len() - 1;
    let deep = scratch.0.join("d".repeat(room));
    std::fs::create_dir(&deep).unwrap();
    let path = deep.join("c.sock");
    assert!(path.as_os_str().len() <= MAX_PATH_BYTES);
    let (_listener, _socket) = bind(&path, 0o600).await.expect("bound through /proc");
    UnixStream::connect(&path).await.expect("it listens");
}

#[tokio::test]
async fn a_deleted_socket_is_published_again_and_only_our_own_is_removed() {
    let scratch = Scratch::new("ours");
    let path = scratch.0.join("corral.sock");
    let (_listener, mut socket) = bind(&path, 0o600).await.unwrap();
    assert_eq!(look(&socket), Look::Ours);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(look(&socket), Look::Gone);
    // Another process's socket at the path meanwhile: never ours to remove.
    let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
    assert_eq!(look(&socket), Look::Replaced);
    remove(&socket);
    assert!(path.exists(), "another process's socket was removed");
    drop(other);
    std::fs::remove_file(&path).unwrap();
    // Published again (what the accept loop does once it sees the path empty): ours, listening,
    // with its mode, and removed at exit.
    let _again = listen(&mut socket).unwrap();
    assert_eq!(look(&socket), Look::Ours);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    UnixStream::connect(&path).await.expect("it listens");
    remove(&socket);
    assert!(!path.exists());
}
