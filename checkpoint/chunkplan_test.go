package checkpoint_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// A realistic same-store plan: 1000 transfers' items and the writes of
// the accounts they touched.
func settlementPlan() checkpoint.ChunkPlanRecord {
	r := checkpoint.ChunkPlanRecord{Target: "accounts(id, balance, version)", EffectID: "settle/2026-11-28/post@3.s41"}
	for i := range 1000 {
		r.Items = append(r.Items, checkpoint.PlanItem{Key: fmt.Sprintf("T-2026-11-28-%08d", 41001+i)})
	}
	for i := range 1800 {
		n := (i*7919)%10000 + 1
		old := int64(100_000 + (i*104729)%90_000)
		r.Writes = append(r.Writes, checkpoint.Write{Key: fmt.Sprintf("A-%07d", n), OldVersion: int64(40 + i%17),
			OldValue: old, NewValue: old - int64((i*31)%10_000) + 5_000})
	}
	return r
}

func TestChunkPlanRoundTrips(t *testing.T) {
	for name, r := range map[string]checkpoint.ChunkPlanRecord{
		"empty":      {},
		"settlement": settlementPlan(),
		"separate store, with operations": {Target: "ledger.db accounts(id, balance, version)", EffectID: "j/k/post@2.c0.1",
			Items: []checkpoint.PlanItem{
				{Key: "T1", Ops: json.RawMessage(`[{"key":"a","kind":"add","amount":-10,"guards":[{"kind":"not_below","limit":0}]}]`)},
				{Key: "T10", Ops: json.RawMessage(`[{"key":"b","kind":"set","amount":7}]`)},
				{Key: "T2"}, // no operations
			},
			Writes: []checkpoint.Write{{Key: "b", OldVersion: 0, NewValue: 7, Insert: true}, {Key: "a", OldVersion: 9, OldValue: 10}}},
		"extremes": {Target: "t\x00\xff", EffectID: "é", Items: []checkpoint.PlanItem{{Key: ""}, {Key: "x"}, {Key: ""}},
			Writes: []checkpoint.Write{
				{Key: "k", OldVersion: math.MaxInt64, OldValue: math.MinInt64, NewValue: math.MaxInt64},
				{Key: "k", OldVersion: math.MinInt64, OldValue: math.MaxInt64, NewValue: math.MinInt64},
				{Key: "", OldVersion: -1, OldValue: 0, NewValue: 0, Insert: true},
				{Key: "k\x00longer", OldVersion: 1, OldValue: 1, NewValue: -1},
			}},
	} {
		t.Run(name, func(t *testing.T) {
			enc := checkpoint.EncodeChunkPlan(r)
			got, err := checkpoint.DecodeChunkPlan(enc)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, r) {
				t.Errorf("decoded %+v\nwant %+v", got, r)
			}
		})
	}
}

// The binary plan is what makes a chunk's record small: a settlement
// chunk's takes well under a third of its JSON.
func TestChunkPlanIsCompact(t *testing.T) {
	r := settlementPlan()
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	bin := checkpoint.EncodeChunkPlan(r)
	if len(bin)*3 > len(js) {
		t.Errorf("binary plan is %d bytes, JSON %d; want under a third", len(bin), len(js))
	}
	t.Logf("1000 items, 1800 writes: binary %d bytes, JSON %d", len(bin), len(js))
}

// Plans recorded as JSON by an earlier Stepwise decode as they were
// written, operations and all.
func TestChunkPlanDecodesJSONPlans(t *testing.T) {
	same := `{"target":"accounts(id, balance, version)","effect_id":"settle/d/post@1.s0","items":[{"key":"T1"},{"key":"T3"}],` +
		`"writes":[{"key":"A-1","old_version":4,"old_value":100,"new_value":90},{"key":"A-2","old_version":0,"old_value":0,"new_value":10,"insert":true}]}`
	got, err := checkpoint.DecodeChunkPlan([]byte(same))
	if err != nil {
		t.Fatal(err)
	}
	want := checkpoint.ChunkPlanRecord{Target: "accounts(id, balance, version)", EffectID: "settle/d/post@1.s0",
		Items: []checkpoint.PlanItem{{Key: "T1"}, {Key: "T3"}},
		Writes: []checkpoint.Write{{Key: "A-1", OldVersion: 4, OldValue: 100, NewValue: 90},
			{Key: "A-2", NewValue: 10, Insert: true}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("same-store JSON plan decoded %+v\nwant %+v", got, want)
	}

	separate := `{"target":"l.db accounts","effect_id":"j/k/post@1.c0.0","items":[{"key":"T1","ops":[{"key":"a","kind":"add","amount":-5,"guards":[{"kind":"not_below","limit":0}]}]},{"key":"T2","ops":null}],"writes":null}`
	got, err = checkpoint.DecodeChunkPlan([]byte(separate))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Items) != 2 || string(got.Items[0].Ops) != `[{"key":"a","kind":"add","amount":-5,"guards":[{"kind":"not_below","limit":0}]}]` ||
		got.Items[1].Ops != nil || got.Writes != nil {
		t.Errorf("separate-store JSON plan decoded %+v; want T1's operations verbatim, none for T2, no writes", got)
	}
	// And re-encoded in binary, it decodes the same.
	again, err := checkpoint.DecodeChunkPlan(checkpoint.EncodeChunkPlan(got))
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Errorf("re-encoded JSON plan decoded %+v, %v; want %+v", again, err, got)
	}
}

func TestChunkPlanRefusesMalformedPlans(t *testing.T) {
	good := checkpoint.EncodeChunkPlan(checkpoint.ChunkPlanRecord{Target: "t", EffectID: "e",
		Items: []checkpoint.PlanItem{{Key: "T1"}, {Key: "T2"}}, Writes: []checkpoint.Write{{Key: "a", OldVersion: 1, OldValue: 5, NewValue: 6}}})
	for name, data := range map[string][]byte{
		"nothing":                               nil,
		"not JSON":                              []byte("hello"),
		"header only":                           []byte("\x00SWP\x01"),
		"newer version":                         append([]byte("\x00SWP\x02"), good[5:]...),
		"truncated":                             good[:len(good)-1],
		"trailing bytes":                        append(append([]byte{}, good...), 0),
		"huge count":                            append([]byte("\x00SWP\x01\x00\x00"), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"shared prefix beyond the previous key": append([]byte("\x00SWP\x01\x00\x00\x01"), 3, 1, 'x', 0),
		"bad flags":                             append([]byte("\x00SWP\x01\x00\x00\x00\x01"), 0, 1, 'a', 2, 0, 0, 0),
	} {
		if r, err := checkpoint.DecodeChunkPlan(data); !errors.Is(err, checkpoint.ErrBadChunkPlan) {
			t.Errorf("%s: decoded %+v, %v; want ErrBadChunkPlan", name, r, err)
		}
	}
}

// FuzzDecodeChunkPlan: no input makes the decoder panic or allocate
// beyond its input, and whatever decodes re-encodes to the same record.
func FuzzDecodeChunkPlan(f *testing.F) {
	f.Add(checkpoint.EncodeChunkPlan(settlementPlan()))
	f.Add(checkpoint.EncodeChunkPlan(checkpoint.ChunkPlanRecord{Target: "t", Items: []checkpoint.PlanItem{{Key: "a", Ops: json.RawMessage(`[1]`)}},
		Writes: []checkpoint.Write{{Key: "k", OldVersion: 1, OldValue: math.MinInt64, NewValue: math.MaxInt64, Insert: true}}}))
	f.Add([]byte(`{"target":"t","effect_id":"e","items":[{"key":"T1","ops":[]}],"writes":[{"key":"a","old_version":1,"old_value":2,"new_value":3}]}`))
	f.Add([]byte("\x00SWP\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := checkpoint.DecodeChunkPlan(data)
		if err != nil {
			if !errors.Is(err, checkpoint.ErrBadChunkPlan) {
				t.Fatalf("error %v does not wrap ErrBadChunkPlan", err)
			}
			return
		}
		again, err := checkpoint.DecodeChunkPlan(checkpoint.EncodeChunkPlan(r))
		if err != nil {
			t.Fatalf("re-encoded plan does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoded plan decodes as %+v; was %+v", again, r)
		}
	})
}

// FuzzChunkPlanRoundTrip: any record built from the fuzzer's values
// decodes as it was encoded.
func FuzzChunkPlanRoundTrip(f *testing.F) {
	f.Add("accounts", "e@1.s0", "T-1", "T-2", []byte(nil), "A-1", int64(3), int64(100), int64(90), false)
	f.Add("", "", "", "", []byte(`[{"key":"a"}]`), "", int64(math.MinInt64), int64(math.MaxInt64), int64(math.MinInt64), true)
	f.Fuzz(func(t *testing.T, target, effectID, k1, k2 string, ops []byte, wk string, ver, old, nv int64, insert bool) {
		r := checkpoint.ChunkPlanRecord{Target: target, EffectID: effectID,
			Items:  []checkpoint.PlanItem{{Key: k1}, {Key: k2}, {Key: k1 + k2}},
			Writes: []checkpoint.Write{{Key: wk, OldVersion: ver, OldValue: old, NewValue: nv, Insert: insert}, {Key: wk + k1, OldVersion: nv, OldValue: nv, NewValue: old}}}
		if len(ops) > 0 {
			r.Items[1].Ops = json.RawMessage(ops)
		}
		got, err := checkpoint.DecodeChunkPlan(checkpoint.EncodeChunkPlan(r))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("decoded %+v\nwant %+v", got, r)
		}
	})
}
