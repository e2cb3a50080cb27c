package enginestate

// DigestFile is one engine's cache digest file (<dir>.cache/<id>,
// docs/FORMAT.md, "Cache residency"), opened like an engine file (never
// blocks, never follows a link, refuses anything but a regular file),
// validated, mapped read-only at its own size and never written. A file
// truncated under the mapping reads torn, never crashes the process (the
// loads run under debug.SetPanicOnFault, as an engine file's). Not safe for
// concurrent use.
type DigestFile struct {
	m      *mapping
	path   string
	header DigestHeader
	inode  uint64
	// scratch holds the entries of the attempts of a read, reused between
	// reads; what a read returns is a copy.
	scratch []uint64
}

// OpenDigestFile opens and validates path in the order of docs/FORMAT.md,
// "Cache residency": a regular file (else RefusedEntry, an *Error), then
// magic, version, at least a header, the header's fields, the size (steps
// 2 to 6, a *DigestError), then one read (steps 7 to 9: a torn read does
// not fail the open, a damaged digest does).
func OpenDigestFile(path string) (*DigestFile, error) {
	m, header, inode, err := mapHeaderFile(path, DigestHeaderSize,
		func(start []byte, size int64) (DigestHeader, int, error) {
			h, err := checkDigestStart(path, start, size)
			if err != nil {
				return h, 0, err
			}
			return h, int(digestSize(h.Capacity)), nil
		})
	if err != nil {
		return nil, err
	}
	d := &DigestFile{m: m, path: path, header: header, inode: inode}
	if _, err := d.Read(); err != nil && !isTornDigest(err) {
		m.close()
		return nil, err
	}
	return d, nil
}

func isTornDigest(err error) bool {
	e, ok := err.(*DigestError)
	return ok && e.Class == TornDigest
}

// Read is a consistent copy of the digest, checked (steps 7 to 9: a
// version, count within the capacity, held at least count, entries strictly
// ascending); a *DigestError of class TornDigest when no consistent copy
// could be had within the retry bound, the sequence was 0, or the file was
// truncated under the mapping (see Truncated). Record.State is the state
// word as loaded by this read.
func (d *DigestFile) Read() (DigestRecord, error) {
	var control [digestControlWords]uint64
	var blocks []uint64
	var seq, state uint64
	torn := true
	ok := d.m.guard(func() {
		// state is a single word outside the protocol (FORMAT.md).
		state = d.m.load(digestStateWord * 8)
		blocks, seq, torn = d.m.readDigestSeqlock(&control, int(d.header.Capacity), d.scratch)
	})
	if !ok || torn {
		return DigestRecord{}, &DigestError{Class: TornDigest, Name: d.path, LastSeq: seq}
	}
	d.scratch = blocks
	if err := checkControl(d.path, &d.header, &control); err != nil {
		return DigestRecord{}, err
	}
	if err := checkEntries(d.path, blocks); err != nil {
		return DigestRecord{}, err
	}
	header := d.header
	header.State = state
	return recordOf(&header, &control, append([]uint64(nil), blocks...)), nil
}

// IsRetired reports that the writer retired this file (closed it, or
// replaced it with a new one): open the path again for the current one.
// False when the mapping faulted (then Truncated is true).
func (d *DigestFile) IsRetired() bool {
	var state uint64
	d.m.guard(func() { state = d.m.load(digestStateWord * 8) })
	return state == StateRetired
}

// Seq is the sequence word now (one load): a cheap "did anything change?".
func (d *DigestFile) Seq() uint64 {
	return d.m.guardedLoad(digestSeqOffset)
}

// Truncated reports that a load faulted: the file was truncated under the
// mapping; open it again to see what it is now.
func (d *DigestFile) Truncated() bool { return d.m.faulted }

// Header is the header as it was at open (State may have changed since).
func (d *DigestFile) Header() DigestHeader { return d.header }

// Generation is the generation of the engine file this digest belongs to.
func (d *DigestFile) Generation() uint64 { return d.header.Generation }

// Path is the file's path.
func (d *DigestFile) Path() string { return d.path }

// Inode is the file's inode.
func (d *DigestFile) Inode() uint64 { return d.inode }

// Close unmaps the file. The DigestFile must not be used afterwards.
func (d *DigestFile) Close() error {
	d.m.close()
	return nil
}
