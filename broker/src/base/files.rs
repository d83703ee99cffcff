//! Files the broker reads whose path someone else chose (the config file, token files): how
//! to open them so that what the path names can never block or flood the reader.
//!
//! A FIFO with no writer blocks an `open` for reading forever (and with it a SIGHUP reload,
//! or shutdown waiting on the thread); `/dev/zero` never ends. Opened with [`OPEN_FLAGS`],
//! then refused unless `fstat` says it is a regular file ([`kind_of`] names what it is).

/// `O_NONBLOCK`: opening a FIFO for reading returns at once instead of waiting for a writer;
/// it changes nothing for a regular file. `O_NOCTTY`: a terminal never becomes ours.
pub const OPEN_FLAGS: i32 =
    nix::fcntl::OFlag::O_NONBLOCK.bits() | nix::fcntl::OFlag::O_NOCTTY.bits();

/// What a file that is not a regular one is, for error messages.
pub fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let t = meta.file_type();
    if t.is_file() {
        "regular file"
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}
