package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// ChunkPlanRecord is what a chunk plan holds (ChunkPlan.Plan): the target
// its writes land in, its effect ID, the items whose operations made it
// and its compare-and-set writes. EncodeChunkPlan and DecodeChunkPlan are
// its one codec, used by every backend's callers alike: a store keeps the
// bytes it is given and never reads them.
type ChunkPlanRecord struct {
	// Target names where the writes land.
	Target string `json:"target"`
	// EffectID is the plan's effect ID (the chunk_plans row's is
	// authoritative).
	EffectID string `json:"effect_id"`
	// Items are the chunk's planned items (not those a guard rejected), in
	// item order.
	Items []PlanItem `json:"items"`
	// Writes are the plan's compare-and-set writes, in the order their
	// keys were first touched.
	Writes []Write `json:"writes"`
}

// PlanItem is one item of a chunk plan.
type PlanItem struct {
	Key string `json:"key"`
	// Ops are the item's relative operations in the encoding of the
	// package that planned them (steps: a JSON array), kept so that a
	// separate-store plan that lost a race can be made again from them.
	// Empty in a same-store plan, which is recorded applied and never made
	// again.
	Ops json.RawMessage `json:"ops,omitempty"`
}

// chunkPlanMagic opens a chunk plan in the binary encoding (version 1). No
// JSON text starts with a NUL byte, so a plan written as JSON by an
// earlier Stepwise is told apart by its first byte.
const chunkPlanMagic = "\x00SWP\x01"

// ErrBadChunkPlan is wrapped by DecodeChunkPlan's errors: the bytes are
// neither a binary chunk plan nor a JSON one.
var ErrBadChunkPlan = errors.New("checkpoint: malformed chunk plan")

// EncodeChunkPlan encodes r compactly: a short header, then varints and
// key suffixes. Each key is stored as the length of the prefix it shares
// with the previous key of its list and the rest (item keys ascend, and
// a ledger's account keys share long prefixes); a write's new value is
// stored as its difference from the old one (mod 2^64, so every int64
// survives). A same-store plan of 1000 transfers takes about a fifth of
// its JSON.
func EncodeChunkPlan(r ChunkPlanRecord) []byte {
	n := len(chunkPlanMagic) + 2*binary.MaxVarintLen64 + len(r.Target) + len(r.EffectID) + 2*binary.MaxVarintLen64
	for _, it := range r.Items {
		n += 8 + len(it.Ops)
	}
	n += 16 * len(r.Writes)
	b := make([]byte, 0, n)
	b = append(b, chunkPlanMagic...)
	b = appendString(b, r.Target)
	b = appendString(b, r.EffectID)
	b = binary.AppendUvarint(b, uint64(len(r.Items)))
	prev := ""
	for _, it := range r.Items {
		b = appendKey(b, prev, it.Key)
		prev = it.Key
		b = binary.AppendUvarint(b, uint64(len(it.Ops)))
		b = append(b, it.Ops...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Writes)))
	prev = ""
	for _, w := range r.Writes {
		b = appendKey(b, prev, w.Key)
		prev = w.Key
		var flags byte
		if w.Insert {
			flags |= 1
		}
		b = append(b, flags)
		b = binary.AppendVarint(b, w.OldVersion)
		b = binary.AppendVarint(b, w.OldValue)
		b = binary.AppendVarint(b, int64(uint64(w.NewValue)-uint64(w.OldValue)))
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendKey appends key as the length of the prefix it shares with prev
// and the rest.
func appendKey(b []byte, prev, key string) []byte {
	shared := 0
	for shared < len(prev) && shared < len(key) && prev[shared] == key[shared] {
		shared++
	}
	b = binary.AppendUvarint(b, uint64(shared))
	return appendString(b, key[shared:])
}

// DecodeChunkPlan decodes a chunk plan written by EncodeChunkPlan, or by
// an earlier Stepwise as JSON (a plan recorded before the binary encoding
// still shows and resumes). Empty lists decode as nil.
func DecodeChunkPlan(data []byte) (ChunkPlanRecord, error) {
	if !bytes.HasPrefix(data, []byte(chunkPlanMagic)) {
		return decodeJSONChunkPlan(data)
	}
	d := planDecoder{b: data[len(chunkPlanMagic):]}
	var r ChunkPlanRecord
	r.Target = d.string("target")
	r.EffectID = d.string("effect ID")
	if n := d.count("items", 3); n > 0 {
		r.Items = make([]PlanItem, n)
		prev := ""
		for i := range r.Items {
			r.Items[i].Key = d.key(prev, "item key")
			prev = r.Items[i].Key
			if ops := d.bytes("item operations"); len(ops) > 0 {
				r.Items[i].Ops = json.RawMessage(ops)
			}
		}
	}
	if n := d.count("writes", 6); n > 0 {
		r.Writes = make([]Write, n)
		prev := ""
		for i := range r.Writes {
			w := &r.Writes[i]
			w.Key = d.key(prev, "write key")
			prev = w.Key
			switch f := d.byte("write flags"); f {
			case 0:
			case 1:
				w.Insert = true
			default:
				d.failf("write %d has flags %#x", i, f)
			}
			w.OldVersion = d.varint("old version")
			w.OldValue = d.varint("old value")
			w.NewValue = int64(uint64(w.OldValue) + uint64(d.varint("new value")))
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.failf("%d bytes after the last write", len(d.b))
	}
	if d.err != nil {
		return ChunkPlanRecord{}, d.err
	}
	return r, nil
}

// decodeJSONChunkPlan decodes a plan in the JSON encoding steps.ForEach
// wrote before the binary one.
func decodeJSONChunkPlan(data []byte) (ChunkPlanRecord, error) {
	var r ChunkPlanRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return ChunkPlanRecord{}, fmt.Errorf("%w: %w", ErrBadChunkPlan, err)
	}
	for i := range r.Items {
		if ops := bytes.TrimSpace(r.Items[i].Ops); len(ops) == 0 || string(ops) == "null" {
			r.Items[i].Ops = nil
		}
	}
	if len(r.Items) == 0 {
		r.Items = nil
	}
	if len(r.Writes) == 0 {
		r.Writes = nil
	}
	return r, nil
}

// planDecoder reads a binary chunk plan; its first error sticks, and
// every later read returns zero values.
type planDecoder struct {
	b   []byte
	err error
}

func (d *planDecoder) failf(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrBadChunkPlan, fmt.Sprintf(format, args...))
	}
	d.b = nil
}

func (d *planDecoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.failf("%s: truncated or overlong varint", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *planDecoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.failf("%s: truncated or overlong varint", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *planDecoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.failf("%s: truncated", what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// bytes reads a length-prefixed byte string, aliasing the input.
func (d *planDecoder) bytes(what string) []byte {
	n := d.uvarint(what)
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.failf("%s: %d bytes long, %d left", what, n, len(d.b))
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *planDecoder) string(what string) string { return string(d.bytes(what)) }

// key reads a key stored against prev (see appendKey).
func (d *planDecoder) key(prev, what string) string {
	shared := d.uvarint(what)
	if d.err == nil && shared > uint64(len(prev)) {
		d.failf("%s shares %d bytes with a previous key of %d", what, shared, len(prev))
	}
	rest := d.bytes(what)
	if d.err != nil {
		return ""
	}
	return prev[:shared] + string(rest)
}

// count reads a list's length; each entry takes at least min bytes, so a
// count the rest cannot hold is refused before anything is allocated.
func (d *planDecoder) count(what string, min int) int {
	n := d.uvarint(what)
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.b)/min) {
		d.failf("%d %s cannot fit in %d bytes", n, what, len(d.b))
		return 0
	}
	return int(n)
}
