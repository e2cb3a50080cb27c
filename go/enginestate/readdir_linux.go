package enginestate

import (
	"encoding/binary"
	"syscall"
)

// dirent is one directory entry as the listing gives it: name, inode and
// type (d_type; DT_UNKNOWN is resolved with lstat). os.ReadDir does not
// expose the inode, and a stat per entry is what the listing should save.
type dirent struct {
	name  string
	inode uint64
	kind  uint8
}

// readDir lists dir with getdents64, without "." and "..".
func readDir(dir string) ([]dirent, error) {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		if err == syscall.ENOTDIR {
			return nil, &Error{Class: IO, Name: dir, What: "use as a directory", Err: err}
		}
		return nil, &Error{Class: IO, Name: dir, What: actionReadDirectory, Err: err}
	}
	defer syscall.Close(fd)
	var out []dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := syscall.ReadDirent(fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &Error{Class: IO, Name: dir, What: actionReadDirectory, Err: err}
		}
		if n <= 0 {
			break
		}
		// struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.LittleEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				break
			}
			name := b[19:reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			de := dirent{name: string(name), inode: binary.LittleEndian.Uint64(b[0:8]), kind: b[18]}
			b = b[reclen:]
			if de.name == "." || de.name == ".." || de.name == "" {
				continue
			}
			if de.kind == syscall.DT_UNKNOWN {
				var st syscall.Stat_t
				if syscall.Lstat(dir+"/"+de.name, &st) == nil {
					de.kind = dtOf(st.Mode)
				}
			}
			out = append(out, de)
		}
	}
	return out, nil
}

func dtOf(mode uint32) uint8 {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		return syscall.DT_REG
	case syscall.S_IFDIR:
		return syscall.DT_DIR
	case syscall.S_IFLNK:
		return syscall.DT_LNK
	case syscall.S_IFIFO:
		return syscall.DT_FIFO
	case syscall.S_IFSOCK:
		return syscall.DT_SOCK
	case syscall.S_IFCHR:
		return syscall.DT_CHR
	case syscall.S_IFBLK:
		return syscall.DT_BLK
	}
	return syscall.DT_UNKNOWN
}
