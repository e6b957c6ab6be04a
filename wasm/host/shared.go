package host

import (
	"sort"
	"sync"
)

// sharedData is proxy_get/set_shared_data: a process-wide key-value store partitioned by
// vm_id, with a compare-and-swap version per entry (proxy-wasm-cpp-host's SharedData).
type sharedData struct {
	mu   sync.Mutex
	byVM map[string]map[string]*sharedEntry
	cas  uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

// SharedValue is one entry of the shared data store.
type SharedValue struct {
	Value []byte
	CAS   uint32
}

func (s *sharedData) nextCAS() uint32 {
	s.cas++
	if s.cas == 0 { // 0 means "no CAS" to the guest
		s.cas++
	}
	return s.cas
}

func (s *sharedData) get(vmID, key string) ([]byte, uint32, Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byVM[vmID][key]
	if !ok {
		return nil, 0, StatusNotFound
	}
	return append([]byte(nil), e.value...), e.cas, StatusOK
}

// set stores value. A non-zero cas must match the entry's current version; like
// proxy-wasm-cpp-host, a cas for a key that does not exist yet is not checked.
func (s *sharedData) set(vmID, key string, value []byte, cas uint32) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.byVM[vmID]
	if m == nil {
		m = map[string]*sharedEntry{}
		s.byVM[vmID] = m
	}
	if e, ok := m[key]; ok {
		if cas != 0 && cas != e.cas {
			return StatusCasMismatch
		}
		e.value = append([]byte(nil), value...)
		e.cas = s.nextCAS()
		return StatusOK
	}
	m[key] = &sharedEntry{value: append([]byte(nil), value...), cas: s.nextCAS()}
	return StatusOK
}

func (s *sharedData) snapshot(vmID string) map[string]SharedValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]SharedValue, len(s.byVM[vmID]))
	for k, e := range s.byVM[vmID] {
		out[k] = SharedValue{Value: append([]byte(nil), e.value...), CAS: e.cas}
	}
	return out
}

// sharedQueues is the process-wide set of shared queues. A queue is named by (vm_id, name);
// its token is process-wide; the last root context to register it receives
// proxy_on_queue_ready (proxy-wasm-cpp-host's SharedQueue).
type sharedQueues struct {
	mu     sync.Mutex
	byName map[queueName]uint32
	queues map[uint32]*sharedQueue
	next   uint32
}

type queueName struct{ vmID, name string }

type sharedQueue struct {
	name  queueName
	items [][]byte
	// owner is the instance whose root context registered the queue last; its current
	// VM receives proxy_on_queue_ready, so a replaced instance keeps getting notified (as
	// Envoy's lookup by VM key and context id does after a VM reload).
	owner *instance
}

// QueueSnapshot describes one shared queue.
type QueueSnapshot struct {
	VMID, Name string
	Token      uint32
	Items      [][]byte
}

func (q *sharedQueues) register(vmID, name string, owner *instance) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := queueName{vmID, name}
	tok, ok := q.byName[k]
	if !ok {
		q.next++
		tok = q.next
		q.byName[k] = tok
		q.queues[tok] = &sharedQueue{name: k}
	}
	sq := q.queues[tok]
	sq.owner = owner
	return tok
}

func (q *sharedQueues) resolve(vmID, name string) (uint32, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	tok, ok := q.byName[queueName{vmID, name}]
	if !ok {
		return 0, StatusNotFound
	}
	return tok, StatusOK
}

// enqueue appends value and returns who to notify.
func (q *sharedQueues) enqueue(tok uint32, value []byte) (*instance, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, ok := q.queues[tok]
	if !ok {
		return nil, StatusNotFound
	}
	sq.items = append(sq.items, append([]byte(nil), value...))
	return sq.owner, StatusOK
}

func (q *sharedQueues) dequeue(tok uint32) ([]byte, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, ok := q.queues[tok]
	if !ok {
		return nil, StatusNotFound
	}
	if len(sq.items) == 0 {
		return nil, StatusEmpty
	}
	v := sq.items[0]
	sq.items[0] = nil
	sq.items = sq.items[1:]
	return v, StatusOK
}

func (q *sharedQueues) snapshot() []QueueSnapshot {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]QueueSnapshot, 0, len(q.queues))
	for tok, sq := range q.queues {
		items := make([][]byte, len(sq.items))
		for i, it := range sq.items {
			items[i] = append([]byte(nil), it...)
		}
		out = append(out, QueueSnapshot{VMID: sq.name.vmID, Name: sq.name.name, Token: tok, Items: items})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Token < out[j].Token })
	return out
}
