package filedir

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

func isConfigFile(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return !strings.HasPrefix(filepath.Base(name), ".")
	}
	return false
}

// walk lists the config files of the tree, sorted.
func (s *Source) walk() ([]string, error) { return ConfigFiles(s.dir) }

// ConfigFiles lists the config files of the tree at dir as the source reads them (.yaml,
// .yml and .json files, not hidden, outside hidden directories), sorted.
func ConfigFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != dir && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir // e.g. Kubernetes ConfigMap ..data symlink farms
		}
		if !d.IsDir() && isConfigFile(p) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading config directory %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

// filesAfter is the sorted file list after a change at paths, from the files read last time,
// and the files to read again (by path relative to the directory); ok is false when only a
// walk can tell (the caller holds s.mu).
func (s *Source) filesAfter(paths map[string]struct{}) (files []string, reread map[string]bool, ok bool) {
	if s.unreadable {
		return nil, nil, false
	}
	present := make(map[string]bool, len(s.parsed)+len(paths))
	for rel := range s.parsed {
		present[rel] = true
	}
	reread = map[string]bool{}
	for p := range paths {
		rel, err := filepath.Rel(s.dir, p)
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			return nil, nil, false
		}
		fi, err := os.Stat(p)
		switch {
		case err == nil && fi.IsDir():
			return nil, nil, false
		case inHiddenDir(rel):
			// A walk skips hidden directories: nothing there is in force.
		case !isConfigFile(p):
			if s.hasFilesUnder(rel) {
				return nil, nil, false // a directory removed or renamed
			}
		case errors.Is(err, fs.ErrNotExist):
			if s.hasFilesUnder(rel) {
				return nil, nil, false
			}
			delete(present, rel)
		default:
			present[rel], reread[rel] = true, true
		}
	}
	files = make([]string, 0, len(present))
	for rel := range present {
		files = append(files, filepath.Join(s.dir, rel))
	}
	sort.Strings(files)
	return files, reread, true
}

// inHiddenDir reports whether a path relative to the directory lies in a hidden
// subdirectory, which a walk skips.
func inHiddenDir(rel string) bool {
	dir := filepath.Dir(rel)
	if dir == "." {
		return false
	}
	for _, part := range strings.Split(dir, string(filepath.Separator)) {
		if strings.HasPrefix(part, ".") {
			return true
		}
	}
	return false
}

// hasFilesUnder reports whether files read last time lie under the directory rel.
func (s *Source) hasFilesUnder(rel string) bool {
	prefix := rel + string(filepath.Separator)
	for file := range s.parsed {
		if strings.HasPrefix(file, prefix) {
			return true
		}
	}
	return false
}

// readChanged reads a file, or returns had when the file holds exactly those bytes: an
// unchanged file is compared in place, without a copy of it to collect.
func readChanged(file string, had []byte) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	readAll := func() ([]byte, error) {
		b := bytes.NewBuffer(make([]byte, 0, fi.Size()+bytes.MinRead))
		_, err := b.ReadFrom(f)
		return b.Bytes(), err
	}
	if had == nil || fi.Size() != int64(len(had)) {
		return readAll()
	}
	var buf [32 << 10]byte
	for off := 0; ; {
		n, err := io.ReadFull(f, buf[:])
		if n > 0 && (off+n > len(had) || !bytes.Equal(buf[:n], had[off:off+n])) {
			break // differs (or grew): read it whole
		}
		off += n
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			if off == len(had) {
				return had, nil
			}
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return readAll()
}

// read reads files, in walk order: those in reread (every one when it is nil) from the
// disk, the others as last read. Only a file whose bytes changed is parsed again: a change
// to one file of a large directory costs that file.
func (s *Source) read(files []string, reread map[string]bool) []fileRead {
	reads := make([]fileRead, len(files))
	for i, file := range files {
		rel, _ := filepath.Rel(s.dir, file)
		last, ok := s.parsed[rel]
		r := fileRead{rel: rel, data: last.data, docs: last.docs}
		if reread == nil || reread[rel] {
			r.data, r.err = readChanged(file, r.data)
		}
		if r.err == nil && (!ok || !bytes.Equal(last.data, r.data)) {
			r.docs, r.reparsed = config.ParseFile(rel, r.data), true
		}
		reads[i] = r
	}
	return reads
}

// parsedFile remembers a file's bytes and what they parsed to.
type parsedFile struct {
	data []byte
	docs []config.Document
}
