package enginestate

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
)

// cacheSlot is what a Dir holds of one engine's cache digest (with
// Options.CacheDigests), as the Rust reader's (reader/src/shm_dir/cache.rs):
// the file <dir>.cache/<id>, mapped at the first snapshot that names a
// digest; the digest read last, handed out again while the snapshot names no
// later version (a compare per read); what could not be read, reported as
// that engine's error without costing every read a system call or a spin.
type cacheSlot struct {
	// file is the digest file, mapped at the first version that needed it.
	file *DigestFile
	// held is the last digest read, of generation heldGeneration.
	held           *CacheDigest
	heldGeneration uint64
	// tornSeq: the sequence word of a torn read (tornKnown); the file is not
	// read again until it changes (a writer that died mid-write leaves it
	// torn for good).
	tornSeq   uint64
	tornKnown bool
	// failed: a version whose digest could not be had, not tried again
	// until the snapshot names another one.
	failed *cacheFailure
}

type cacheFailure struct {
	version uint64 // the snapshot's cache_version then
	err     *Error
	// reported: a missing digest (MissingCache, not Damaged) is reported
	// once per version; a damaged one (CorruptCache) at every read while
	// the snapshot names it.
	reported bool
}

// digest is the digest of engine id (state directory dir) for a snapshot of
// generation naming version (its cache_version; 0: none). The held digest
// is handed out again while it is of that generation and at least that
// version (the writer writes a digest before a snapshot names it, so the
// file may be ahead of the snapshot, never behind) and its file is not
// retired. Otherwise the file is read: mapped first (or again, once its
// writer retired it for a new one, it was truncated, or it is of another
// generation).
func (s *cacheSlot) digest(dir, id string, generation, version uint64) *CacheDigest {
	if version == 0 {
		return nil
	}
	if s.held != nil && s.heldGeneration == generation && s.held.Version >= version &&
		(s.file == nil || !s.file.IsRetired()) {
		return s.held
	}
	return s.read(dir, id, generation, version)
}

func (s *cacheSlot) read(dir, id string, generation, version uint64) *CacheDigest {
	if s.failed != nil && s.failed.version == version {
		return nil
	}
	if s.file == nil || s.file.IsRetired() || s.file.Truncated() || s.file.Generation() != generation {
		s.tornKnown = false
		s.closeFile()
		path := filepath.Join(CacheDir(dir), id)
		file, err := OpenDigestFile(path)
		var ioErr *Error
		switch {
		case err == nil:
			s.file = file
		case errors.As(err, &ioErr) && ioErr.Class == IO && errors.Is(ioErr.Err, syscall.ENOENT):
			return s.fail(path, version, fmt.Sprintf(
				"the snapshot names digest version %d, but there is no digest file", version), false, nil)
		default:
			return s.fail(path, version, reasonOf(err), true, err)
		}
	}
	f := s.file
	if f.IsRetired() {
		// Its writer closed it (and has not put a new one in place): no
		// digest, and nothing wrong to report.
		s.held = nil
		return nil
	}
	if f.Generation() != generation {
		// A digest of another run of the engine (its writer has not written
		// one for this run yet): not used.
		return s.fail(f.Path(), version, fmt.Sprintf("it belongs to generation %d of the engine, not to "+
			"generation %d that names digest version %d", f.Generation(), generation, version), false, nil)
	}
	if s.tornKnown && s.tornSeq == f.Seq() {
		return nil
	}
	r, err := f.Read()
	var refused *DigestError
	switch {
	case err == nil && r.Digest.Version < version:
		return s.fail(f.Path(), version, fmt.Sprintf("it holds version %d, older than the version %d the "+
			"snapshot names", r.Digest.Version, version), false, nil)
	case err == nil:
		s.held, s.heldGeneration = &r.Digest, generation
		s.tornKnown, s.failed = false, nil
		return s.held
	case errors.As(err, &refused) && refused.Class == TornDigest:
		// Read again once the writer stores something (the next read, for
		// a live writer mid-write).
		s.tornSeq, s.tornKnown = refused.LastSeq, true
		return nil
	}
	return s.fail(f.Path(), version, reasonOf(err), true, err)
}

// reasonOf is an error's message without the name a cache digest error
// puts in front of it.
func reasonOf(err error) string {
	var refused *DigestError
	if errors.As(err, &refused) {
		return refused.reason()
	}
	return err.Error()
}

// fail remembers that version's digest could not be had, and why: damaged
// (CorruptCache) or not there for the snapshot (MissingCache).
func (s *cacheSlot) fail(path string, version uint64, what string, damaged bool, cause error) *CacheDigest {
	class := MissingCache
	if damaged {
		class = CorruptCache
	}
	s.failed = &cacheFailure{version: version,
		err: &Error{Class: class, Name: path, What: what, Damaged: damaged, Err: cause}}
	return nil
}

// error is the error to report with a read whose snapshot named version,
// if any: a damaged digest at every read while the snapshot names its
// version, a missing one once.
func (s *cacheSlot) error(version uint64) error {
	f := s.failed
	if f == nil || f.version != version || (f.reported && !f.err.Damaged) {
		return nil
	}
	f.reported = true
	return f.err
}

func (s *cacheSlot) closeFile() {
	if s.file != nil {
		s.file.Close()
		s.file = nil
	}
}
