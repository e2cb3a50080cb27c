package enginestate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
)

// File is one engine file, mapped read-only and validated at open
// (docs/FORMAT.md, "Reading a directory"). Not safe for concurrent use.
type File struct {
	m        *mapping
	path     string
	header   Header
	engineID string
	inode    uint64
}

// OpenFile opens and validates path. It never blocks and never follows a
// link: anything but a regular file is refused (RefusedEntry).
func OpenFile(path string) (*File, error) {
	fd, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd) // the mapping outlives the descriptor
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &Error{Class: IO, Name: path, What: "stat", Err: err}
	}
	if err := checkSize(fd, st.Size, path); err != nil {
		return nil, err
	}
	m, err := mapFile(fd, FileSize)
	if err != nil {
		return nil, &Error{Class: IO, Name: path, What: "map", Err: err}
	}
	f := &File{m: m, path: path, inode: st.Ino}
	if err := f.validate(); err != nil {
		m.close()
		return nil, err
	}
	return f, nil
}

// openRegular opens path read-only with O_NONBLOCK (opening a FIFO without
// a writer would otherwise wait forever), O_NOFOLLOW (a symbolic link fails
// with ELOOP instead of being followed out of the directory) and O_CLOEXEC,
// then fstats the descriptor itself (not the path, which may have changed)
// and refuses anything that is not a regular file.
//
// Before the open, an lstat refuses what is no regular file without opening
// it (FORMAT.md): opening a device node can have effects of its own, and a
// FIFO's open succeeds. (Swapped in between lstat and open, an entry is
// still refused by the fstat.) Gone or unreadable: the open says which.
func openRegular(path string) (int, error) {
	var pre syscall.Stat_t
	if syscall.Lstat(path, &pre) == nil && pre.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return -1, refusedMode(path, pre.Mode)
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ELOOP) {
		return -1, &Error{Class: RefusedEntry, Name: path, What: "symbolic link, not followed"}
	}
	if err != nil {
		return -1, &Error{Class: IO, Name: path, What: actionOpenForReading, Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return -1, &Error{Class: IO, Name: path, What: "stat", Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return -1, refusedMode(path, st.Mode)
	}
	return fd, nil
}

// refusedMode is the refusal of an entry of mode that is no regular file.
func refusedMode(path string, mode uint32) error {
	if mode&syscall.S_IFMT == syscall.S_IFLNK {
		return &Error{Class: RefusedEntry, Name: path, What: "symbolic link, not followed"}
	}
	return &Error{Class: RefusedEntry, Name: path, What: "not a regular file (" + kindName(mode) + ")"}
}

func kindName(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return "a directory"
	case syscall.S_IFIFO:
		return "a FIFO"
	case syscall.S_IFSOCK:
		return "a socket"
	case syscall.S_IFCHR:
		return "a character device"
	case syscall.S_IFBLK:
		return "a block device"
	case syscall.S_IFLNK:
		return "a symbolic link"
	}
	return "an unknown file type"
}

// checkSize tells a foreign file, a future layout and a truncated file apart
// before anything is mapped: the version is checked before the size (a
// later version may have another size).
func checkSize(fd int, size int64, path string) error {
	if size == FileSize {
		return nil
	}
	var start [12]byte
	have, err := syscall.Pread(fd, start[:], 0)
	if err != nil {
		return &Error{Class: IO, Name: path, What: "read", Err: err}
	}
	if have >= 8 && binary.LittleEndian.Uint64(start[:8]) != Magic {
		return &Error{Class: NotEngineState, Name: path}
	}
	if have == 12 {
		if version := binary.LittleEndian.Uint32(start[8:]); version != LayoutVersion {
			return &Error{Class: UnknownVersion, Name: path, Found: version, Supported: LayoutVersion}
		}
	}
	return &Error{Class: WrongSize, Name: path, Size: size}
}

// validate loads the header and engine id words and checks them.
func (f *File) validate() error {
	var words [HeaderSize / 8]uint64
	var id [EngineIDFieldSize]byte
	ok := f.m.guard(func() {
		for i := range words {
			words[i] = f.m.load(8 * i)
		}
		for i := 0; i < EngineIDFieldSize; i += 8 {
			binary.LittleEndian.PutUint64(id[i:], f.m.load(EngineIDOffset+i))
		}
	})
	if !ok {
		// Truncated between the fstat and the loads.
		return &Error{Class: CorruptHeader, Name: f.path, What: "the file was truncated while it was opened"}
	}
	h := headerFromWords(&words)
	corrupt := func(what string) error { return &Error{Class: CorruptHeader, Name: f.path, What: what} }
	switch {
	case h.Magic != Magic:
		return &Error{Class: NotEngineState, Name: f.path}
	case h.LayoutVersion != LayoutVersion:
		return &Error{Class: UnknownVersion, Name: f.path, Found: h.LayoutVersion, Supported: LayoutVersion}
	case h.HeaderSize != HeaderSize || h.PayloadSize != PayloadSize:
		return corrupt(fmt.Sprintf("header/payload size %d/%d, expected %d/%d", h.HeaderSize, h.PayloadSize, HeaderSize, PayloadSize))
	case h.State != StateActive && h.State != StateRetired:
		return corrupt(fmt.Sprintf("state %d", h.State))
	}
	n := 0
	for n < len(id) && id[n] != 0 {
		n++
	}
	engineID := string(id[:n])
	if ok, reason := ValidEngineID(engineID); !ok {
		return corrupt(fmt.Sprintf("invalid engine id %q: %s", engineID, reason))
	}
	if name := filepath.Base(f.path); name != engineID {
		return corrupt(fmt.Sprintf("it names engine %q but the file is called %q", engineID, name))
	}
	f.header, f.engineID = h, engineID
	return nil
}

// Read is a consistent snapshot and the sequence it was published under;
// torn when none could be had within the retry bound (or the file was
// truncated under the mapping: then Truncated reports true).
func (f *File) Read() (snapshot Snapshot, seq uint64, torn bool) {
	var o observed
	f.m.observe(&o, &snapshot)
	return snapshot, o.seq, o.torn
}

// Seq is the sequence word now (one load): a cheap "did anything change?".
func (f *File) Seq() uint64 {
	return f.m.guardedLoad(SeqOffset)
}

// Truncated reports that a load faulted: the file was truncated under the
// mapping; open it again to see what it is now.
func (f *File) Truncated() bool { return f.m.faulted }

// Header is the header as it was at open (State may have changed since).
func (f *File) Header() Header { return f.header }

// EngineID is the engine id recorded in the file.
func (f *File) EngineID() string { return f.engineID }

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Inode is the file's inode: with the generation, what tells a replacement apart.
func (f *File) Inode() uint64 { return f.inode }

// Close unmaps the file. The File must not be used afterwards.
func (f *File) Close() error {
	f.m.close()
	return nil
}

// preadPrefix reads up to len(buf) bytes from the start of fd (fewer at its
// end: a short file) into buf, retrying interrupted reads; a failure is an
// IO *Error naming path. What the router and digest files' opens read their
// header with before mapping anything (mapping a short file would fault).
func preadPrefix(fd int, path string, buf []byte) (int, error) {
	have := 0
	for have < len(buf) {
		n, err := syscall.Pread(fd, buf[have:], int64(have))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return have, &Error{Class: IO, Name: path, What: "read", Err: err}
		}
		if n == 0 {
			break
		}
		have += n
	}
	return have, nil
}

// mapHeaderFile opens path as openRegular does, reads its header alone
// (pread of up to headerSize bytes: mapping a short file would fault),
// lets check validate it against the file's size and say how many bytes to
// map, and maps them read-only: what the router and digest files' opens
// share. It returns the mapping, the checked header and the inode.
func mapHeaderFile[H any](path string, headerSize int,
	check func(start []byte, size int64) (H, int, error)) (*mapping, H, uint64, error) {
	var header H
	fd, err := openRegular(path)
	if err != nil {
		return nil, header, 0, err
	}
	defer syscall.Close(fd) // the mapping outlives the descriptor
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, header, 0, &Error{Class: IO, Name: path, What: "stat", Err: err}
	}
	start := make([]byte, headerSize)
	have, err := preadPrefix(fd, path, start)
	if err != nil {
		return nil, header, 0, err
	}
	header, size, err := check(start[:have], st.Size)
	if err != nil {
		return nil, header, 0, err
	}
	m, err := mapFile(fd, size)
	if err != nil {
		return nil, header, 0, &Error{Class: IO, Name: path, What: "map", Err: err}
	}
	return m, header, st.Ino, nil
}
