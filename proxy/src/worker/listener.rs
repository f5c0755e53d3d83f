//! The Unix socket workers connect to: created with its final permissions, a stale file from a
//! dead proxy replaced, a live proxy's never touched, published again if it is deleted while the
//! proxy runs, and removed at exit (only if the file there is still this proxy's).

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::TaskTracker;
use tracing::{error, warn};

use crate::worker::connection;

/// The longest socket path a worker can connect to: `sun_path` holds 108 bytes with its NUL.
const MAX_PATH_BYTES: usize = 107;

/// How often the accept loop looks whether the socket file is still there: a tmp cleaner or an
/// operator's `rm` once left every later worker waiting for a proxy it could not reach, unseen.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// The worker socket as published: where, with which mode, and which file it is (device and
/// inode), so that only this proxy's own file is ever deleted. Owned by the accept loop.
#[derive(Debug)]
pub struct Socket {
    path: PathBuf,
    mode: u32,
    file: Option<FileId>,
}

/// A file as its device and inode.
type FileId = (u64, u64);

impl Socket {
    /// The file now at the path, if any.
    fn found(&self) -> io::Result<FileId> {
        let metadata = std::fs::symlink_metadata(&self.path)?;
        Ok((metadata.dev(), metadata.ino()))
    }
}

/// Binds the worker socket. A socket file left behind by a proxy that died is replaced; one that a
/// live proxy still answers on is an error, so two proxies never share a path by accident; and a
/// path that is not a socket at all is never deleted. The socket gets permissions `mode`
/// (owner-only by default): whoever can connect sees every payload. A path too long for a
/// worker to connect to is an error here.
pub async fn bind(path: &Path, mode: u32) -> io::Result<(UnixListener, Socket)> {
    if let Some(problem) = path_problem(path) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, problem));
    }
    clear_stale(path).await?;
    let mut socket = Socket { path: path.to_owned(), mode, file: None };
    let listener = listen(&mut socket)?;
    Ok((listener, socket))
}

/// The socket as last published, for an exit that does not wait for the accept loop that owns
/// it ([`remove_published`]).
static PUBLISHED: std::sync::Mutex<Option<(PathBuf, Option<FileId>)>> = std::sync::Mutex::new(None);

/// Publishes the socket at its path, and records which file that is.
fn listen(socket: &mut Socket) -> io::Result<UnixListener> {
    let listener = publish(&socket.path, socket.mode)?;
    socket.file = socket.found().ok();
    *PUBLISHED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
        Some((socket.path.clone(), socket.file));
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// Removes a socket file nobody listens on any more. Only a refused connection proves that:
/// any other failure (EAGAIN from a live proxy whose backlog is full, EACCES from a socket we
/// may not use) leaves the file alone and refuses to start, as deleting a live proxy's socket
/// would cut it off from its workers without a word.
async fn clear_stale(path: &Path) -> io::Result<()> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket; refusing to replace it", path.display()),
        ));
    }
    match existing(UnixStream::connect(path).await.map(drop)) {
        Existing::Live => Err(in_use(path)),
        Existing::Gone => Ok(()),
        Existing::Stale => match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        Existing::Unknown(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "{} exists and connecting to it failed ({e}), so it may belong to a live \
                 process; refusing to replace it (remove it if nothing uses it)",
                path.display()
            ),
        )),
    }
}

/// What connecting to an existing socket file says about it.
#[derive(Debug)]
enum Existing {
    /// Something listens on it.
    Live,
    /// Nothing listens on it: left behind by a process that died.
    Stale,
    /// It went away meanwhile.
    Gone,
    /// Cannot tell.
    Unknown(io::Error),
}

fn existing(connect: io::Result<()>) -> Existing {
    match connect {
        Ok(()) => Existing::Live,
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => Existing::Stale,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Existing::Gone,
        Err(e) => Existing::Unknown(e),
    }
}

/// Binds and listens in a private directory beside `path` (mode 0700: nobody else can reach a
/// socket inside), sets the socket's mode, then links it into place. The file at `path` thus has
/// its final mode from the moment it exists, whatever the umask, and the umask is never touched
/// (it is process-wide, and the runtime's threads are already running). A hard link, not a
/// rename, so that a file that appeared at `path` meanwhile is never replaced: that is a proxy
/// starting at the same time, and the later one fails as `bind` would have.
///
/// Once made, the private directory is opened (a symlink refused, and one not Corral's own, or
/// open to others) and everything else goes through that descriptor, never its name: another user
/// who can write the socket's directory could swap the name for a symlink between two steps, and
/// have Corral chmod, link or delete a file elsewhere. The socket is bound at
/// `/proc/self/fd/N/s` (short, whatever the directory's path), or at the directory's path where
/// there is no `/proc`.
fn publish(path: &Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    let (private, staged) = make_private_dir(path)?;
    let published = publish_in(&private, &staged, path, mode);
    let _ = std::fs::remove_dir(&private); // by name: what another put there is no empty dir of ours
    published
}

fn publish_in(
    private: &Path,
    staged: &Path,
    path: &Path,
    mode: u32,
) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let directory = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(private)?;
    let made = directory.metadata()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if made.uid() != uid || made.mode() & 0o077 != 0 {
        let problem = format!("{} changed hands while Corral was binding in it", private.display());
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, problem));
    }
    let fd = directory.as_raw_fd();
    let through_proc = PathBuf::from(format!("/proc/self/fd/{fd}/s"));
    let address = if Path::new("/proc/self/fd").is_dir() {
        through_proc
    } else if staged.as_os_str().len() > MAX_PATH_BYTES {
        let what =
            "without /proc, the socket is bound first in a directory beside it, and that path";
        return Err(too_long(what, staged.as_os_str().len()));
    } else {
        staged.to_owned()
    };
    let name = c"s";
    let listener = std::os::unix::net::UnixListener::bind(&address)?;
    let linked = (|| {
        // SAFETY: `fd` is an open directory, `name` a NUL-terminated name in it.
        if unsafe { libc::fchmodat(fd, name.as_ptr(), mode as libc::mode_t, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let target = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        // SAFETY: as above, and `target` is a NUL-terminated path; flags 0: a symlink named
        // `s` would be linked itself, not followed (none can be there: the directory is ours).
        if unsafe { libc::linkat(fd, name.as_ptr(), libc::AT_FDCWD, target.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.kind() == io::ErrorKind::AlreadyExists { in_use(path) } else { e });
        }
        Ok(())
    })();
    // SAFETY: as above.
    unsafe { libc::unlinkat(fd, name.as_ptr(), 0) };
    linked.map(|()| listener)
}

/// What makes `path` no place for the worker socket, as far as can be told before binding:
/// checked with the rest of the configuration too, so that the error names the flag or the
/// config file's key it came from and the process exits 2 before binding anything (found at
/// bind, a file's `socket` was named `--socket`, and the exit was 1).
pub fn path_problem(path: &Path) -> Option<String> {
    let length = path.as_os_str().len();
    if length > MAX_PATH_BYTES {
        return Some(too_long("the path", length).to_string());
    }
    // Bound as made absolute (`crate::absolute`, what spawned workers are told): a relative
    // path short as written but long from the working directory passed here, and failed at
    // bind, named `--socket` whatever it came from, with exit 1.
    if path.is_relative() {
        let length = crate::absolute(path).map_or(0, |absolute| absolute.as_os_str().len());
        if length > MAX_PATH_BYTES {
            return Some(too_long("the path, made absolute,", length).to_string());
        }
    }
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        // A directory's form: binding there failed with a bare "No such file or directory".
        return Some(
            "the path ends in `/`: it names the socket file itself, not a directory".to_string(),
        );
    }
    // A file that is no socket is never replaced ([`clear_stale`] says so too, for one made
    // since): found at bind only, it was exit 1, named `--socket` whatever set the path.
    if std::fs::symlink_metadata(path).is_ok_and(|found| !found.file_type().is_socket()) {
        return Some("something that is not a socket is there; Corral will not replace it".into());
    }
    let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty())?;
    match std::fs::metadata(parent) {
        Ok(found) if found.is_dir() => None,
        Ok(_) => Some(format!("{} is not a directory", parent.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Some(format!("the directory {} does not exist", parent.display()))
        }
        // Permission denied, say: binding says so, naming the path.
        Err(_) => None,
    }
}

fn too_long(what: &str, length: usize) -> io::Error {
    let problem = format!(
        "{what} is {length} bytes long, and a Unix socket path holds at most {MAX_PATH_BYTES}: \
         choose a shorter one"
    );
    io::Error::new(io::ErrorKind::InvalidInput, problem)
}

/// The private directory [`publish`] binds in, and the socket's path inside it, for a random
/// `tag`. Short names: a socket path has to fit in 108 bytes, and this one is a little longer
/// than `path`.
fn staging(path: &Path, tag: u32) -> (PathBuf, PathBuf) {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let private = parent.join(format!(".corral-{}-{tag:08x}", std::process::id()));
    let staged = private.join("s");
    (private, staged)
}

/// Creates a private directory beside `path` (mode 0700), under a name nobody can foresee, and
/// never touches what is there already: another name is tried. Its name was once the pid alone,
/// and an entry found under it was cleared first; another user who could write the socket's
/// directory could plant a symlink there, and have Corral delete a file named `s` wherever it
/// pointed (every 5 s, once the socket was deleted), or block the socket for good.
fn make_private_dir(path: &Path) -> io::Result<(PathBuf, PathBuf)> {
    let mut last = None;
    for _ in 0..8 {
        let (private, staged) = staging(path, random_tag());
        match std::fs::DirBuilder::new().mode(0o700).create(&private) {
            Ok(()) => return Ok((private, staged)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(private),
            // Named as the operator knows it, the socket's directory: the private one is ours.
            Err(e) => {
                let parent = private.parent().unwrap_or(Path::new("."));
                let problem = match e.kind() {
                    io::ErrorKind::NotFound => {
                        format!("the directory {} does not exist ({e})", parent.display())
                    }
                    io::ErrorKind::PermissionDenied => format!(
                        "Corral may not create files in the directory {} (it binds the socket \
                         beside where it goes): {e}",
                        parent.display()
                    ),
                    _ => format!("cannot create a file in the directory {}: {e}", parent.display()),
                };
                return Err(io::Error::new(e.kind(), problem));
            }
        }
    }
    let taken = last.map_or_else(String::new, |p| p.display().to_string());
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free name for a private directory beside the socket (last tried: {taken})"),
    ))
}

/// 32 random bits, from a job id's (a fresh one is random).
fn random_tag() -> u32 {
    let id = corral_protocol::JobId::new();
    let bytes = id.as_uuid().as_bytes();
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn in_use(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("{} is in use by another process", path.display()),
    )
}

/// Accepts worker connections until shutdown; each gets its own task, tracked by `tasks`. Every
/// [`WATCH_EVERY`] it looks at the socket's path: deleted, the socket is published again (a new
/// listener; connected workers keep their connections); replaced by another file, it says so once
/// and leaves that file alone. At shutdown it removes the socket file, if it is still ours, while
/// the listener is still open: a socket bound keeps its inode number, which the filesystem could
/// otherwise give to another proxy's socket at the same path, and ours would be taken for it.
pub async fn accept(
    mut listener: UnixListener,
    mut socket: Socket,
    context: connection::Context,
    tasks: TaskTracker,
) {
    let shutdown = context.shutdown.clone();
    let mut watch = tokio::time::interval(WATCH_EVERY);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What was last said about the path: each change is said once.
    let mut said = Look::Ours;
    let mut accept_failures = crate::open_files::AcceptFailures::default();
    let hello_refusals = Refusals::default();
    let waiting_room = std::sync::Arc::new(tokio::sync::Semaphore::new(WAITING_ROOM));
    loop {
        let stream = tokio::select! {
            _ = watch.tick() => {
                let now = match look(&socket) {
                    Look::Gone => match listen(&mut socket) {
                        Ok(again) => {
                            warn!(socket = %socket.path.display(), "the worker socket was deleted: published it again");
                            listener = again;
                            Look::Ours
                        }
                        Err(e) => {
                            if said != Look::Gone {
                                error!(socket = %socket.path.display(), error = %e, "the worker socket was deleted and cannot be published again: workers cannot connect");
                            }
                            Look::Gone
                        }
                    },
                    Look::Replaced => {
                        if said != Look::Replaced {
                            error!(socket = %socket.path.display(), "the worker socket was replaced by another file: workers connecting there do not reach this proxy");
                        }
                        Look::Replaced
                    }
                    Look::Ours => Look::Ours,
                };
                said = now;
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_failures.accepted("worker connections");
                    stream
                }
                Err(e) => {
                    // Typically out of file descriptors: keep the listener, try again.
                    accept_failures.failed("a worker connection", &e);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => {
                remove(&socket);
                drop(listener);
                return;
            }
        };
        // Each connection yet to say hello holds a descriptor and a task: past the bound one
        // waits for a slot in the waiting room, and is closed if the room is full or none comes
        // (an external worker reconnects). Unbounded, 1,100 connections that said nothing took
        // every descriptor, and HTTP (probes included) could not accept until the hello timeout
        // closed them. A worker Corral spawned is never refused so: 33 silent connections held
        // the slots, and a restarted worker was turned away until the hello timeout freed them.
        // Looked up once, here: the connection reads it too (its device, its stage, a kill).
        let peer = stream.peer_cred().ok().and_then(|cred| cred.pid());
        let own_pid = peer.and_then(|pid| u32::try_from(pid).ok()).unwrap_or(0);
        let child = context.children.find(own_pid);
        let permit = match context.awaiting_hello.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) if child.is_some() => None,
            // Workers that say hello as they connect, reconnecting together after a restart,
            // outran their own hellos: this loop accepted the 33rd before the tasks of the first
            // had read theirs, already sent, and 68 of 100 were closed at once. Past the bound a
            // connection waits a moment for a slot, on a task of its own: waited for here, a
            // restarted spawned worker queued behind 300 silent connections took 20 s to get in.
            Err(_) => match waiting_room.clone().try_acquire_owned() {
                Ok(seat) => {
                    let (context, refusals) = (context.clone(), hello_refusals.clone());
                    tasks.spawn(async move {
                        let slot = context.awaiting_hello.clone().acquire_owned();
                        let Ok(Ok(permit)) = tokio::time::timeout(ROOM_WAIT, slot).await else {
                            refused(&refusals);
                            return;
                        };
                        drop(seat);
                        accepted(&refusals);
                        connection::serve(stream, (own_pid, child), context, Some(permit)).await;
                    });
                    continue;
                }
                Err(_) => {
                    refused(&hello_refusals);
                    continue;
                }
            },
        };
        accepted(&hello_refusals);
        tasks.spawn(connection::serve(stream, (own_pid, child), context.clone(), permit));
    }
}

/// Connections refused for want of a slot before their hello: logged once a minute.
type Refusals = std::sync::Arc<std::sync::Mutex<crate::open_files::AcceptFailures>>;

fn refused(refusals: &Refusals) {
    let why = "as many connections as allowed are yet to say hello; closed";
    let mut refusals = refusals.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    refusals.failed("a worker connection", &io::Error::other(why));
}

fn accepted(refusals: &Refusals) {
    let mut refusals = refusals.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    refusals.accepted("worker connections");
}

/// Connections that may wait for their hello at once, beyond one per spawned worker: what
/// workers started by hand reconnecting together need, with room to spare, at a descriptor
/// each (`open_files` keeps room for them).
pub const AWAITING_HELLO: usize = 32;

/// Connections past [`AWAITING_HELLO`] that may wait [`ROOM_WAIT`] for one of its slots, each
/// on a task of its own: with the slots, as many as may connect without being spawned
/// (`connection::MAX_EXTERNAL`), so that all of them reconnecting together get in; past them a
/// connection is closed at once. `open_files` keeps a descriptor for each.
pub const WAITING_ROOM: usize = connection::MAX_EXTERNAL - AWAITING_HELLO;

/// How long a connection past [`AWAITING_HELLO`] waits for a slot before it is closed: ample
/// for workers whose hellos are already sent (each read in well under a millisecond).
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What is at the socket's path now.
#[derive(Debug, PartialEq)]
enum Look {
    Ours,
    Gone,
    Replaced,
}

fn look(socket: &Socket) -> Look {
    match socket.found() {
        Ok(file) if Some(file) == socket.file => Look::Ours,
        Ok(_) => Look::Replaced,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Look::Gone,
        // Cannot tell (a directory we may no longer read): leave it.
        Err(_) => Look::Ours,
    }
}

/// Removes the socket as last published, if the file at its path is still it: for a hurried
/// exit (a second stop signal), which had left the file behind; the README promises it gone.
pub fn remove_published() {
    let published = PUBLISHED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    if let Some((path, file)) = published {
        remove(&Socket { path, mode: 0, file });
    }
}

/// Removes the socket file, if the file at its path is still this proxy's: another proxy's socket
/// there (started after ours was deleted) is not ours to remove.
fn remove(socket: &Socket) {
    if look(socket) != Look::Ours {
        return;
    }
    if let Err(e) = std::fs::remove_file(&socket.path) {
        if e.kind() != io::ErrorKind::NotFound {
            warn!(path = %socket.path.display(), error = %e, "could not remove the worker socket");
        }
    }
}

#[cfg(test)]
mod tests;
