package coord

import (
	"math"
	"slices"
	"testing"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func pageOf(more bool, next uint64, ids ...uint64) listPage {
	pg := listPage{more: more, next: next}
	for _, id := range ids {
		pg.add(&nornv1.Task{Id: id})
	}
	return pg
}

func idsOf(ts []*nornv1.Task) []uint64 {
	var out []uint64
	for _, t := range ts {
		out = append(out, t.GetId())
	}
	return out
}

// A newest-first page keeps the tasks above the highest point where a
// source stopped, newest first, at most the page size, and resumes below
// what it returned.
func TestMergeNewest(t *testing.T) {
	// Source A stopped at 50 (its budget spent), B went down to 10: B's
	// tasks at or below 50 wait for the next page, which starts at 50.
	r := mergeNewest([]listPage{pageOf(true, 50, 90, 70), pageOf(false, 0, 80, 60, 40, 10)}, 10)
	if got := idsOf(r.Tasks); !slices.Equal(got, []uint64{90, 80, 70, 60}) {
		t.Fatalf("page %v, want 90 80 70 60", got)
	}
	if from, err := decodeNewestToken(r.NextPageToken); err != nil || from != 50 {
		t.Fatalf("next page from %d, %v; want 50", from, err)
	}
	// Over the page size: the next page starts below the last returned.
	r = mergeNewest([]listPage{pageOf(false, 0, 90, 70), pageOf(false, 0, 80, 60)}, 3)
	if got := idsOf(r.Tasks); !slices.Equal(got, []uint64{90, 80, 70}) {
		t.Fatalf("page %v, want 90 80 70", got)
	}
	if from, err := decodeNewestToken(r.NextPageToken); err != nil || from != 69 {
		t.Fatalf("next page from %d, %v; want 69", from, err)
	}
	// Everything examined: the last page.
	if r := mergeNewest([]listPage{pageOf(false, 0, 5), pageOf(false, 0)}, 3); r.NextPageToken != "" || len(r.Tasks) != 1 {
		t.Fatalf("last page %v", r)
	}
	// Tokens: the first page starts at the top; a partition-order token
	// is refused.
	if from, err := decodeNewestToken(""); err != nil || from != math.MaxUint64 {
		t.Fatalf("first page from %d, %v", from, err)
	}
	if _, err := decodeNewestToken(encodePageToken(3, 7)); err == nil {
		t.Fatal("a partition-order token was taken for a newest-first one")
	}
}
