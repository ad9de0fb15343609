package steps

import (
	"context"
	"fmt"
	"runtime/debug"
)

// ReadAhead returns the source with one chunk of read-ahead: while a
// ForEach processes and commits a chunk, another goroutine reads the
// source's next chunk of items (Paged: its next page), so the store's
// commit and the source's query overlap. At most one chunk is read ahead,
// so memory stays bounded at a few chunks. Use it when the source's items
// do not depend on the effects of the chunks before them (the transfers
// of a day, say, read while their postings commit), since the next chunk
// is read before the current one commits; the source's functions then
// run on another goroutine than the item function. Everything else is as
// without it: items are processed in the source's order, each chunk
// commits as before, and a rerun holds the items to their fingerprints.
func (s Source[I]) ReadAhead() Source[I] {
	s.readAhead = true
	return s
}

// aheadChunk is one chunk of items read ahead: keys and items in the
// source's order.
type aheadChunk[I any] struct {
	keys  []string
	items []I
}

// fillAhead is fill for a source read one chunk ahead: a goroutine reads
// src into chunks (of the items holds keeps), handing each over through a
// channel that holds one, while this one processes and commits them. A
// failed chunk stops the reader; the reader's error comes after the
// chunks it read. A panic in the source's functions is raised again on
// this goroutine, where the runner records it as the attempt's failure.
func (b *batch[I, O]) fillAhead(ctx context.Context, src Source[I], holds func(key string, item I) bool) error {
	size := b.opts.chunkSize
	b.reserve(size)
	rctx, stop := context.WithCancel(ctx)
	chunks := make(chan aheadChunk[I], 1)
	srcErr := make(chan error, 1)
	go func() {
		defer close(chunks)
		defer func() {
			if p := recover(); p != nil {
				srcErr <- readerPanic{value: p, stack: debug.Stack()}
			}
		}()
		cur := aheadChunk[I]{keys: make([]string, 0, size), items: make([]I, 0, size)}
		err := src.all(rctx, func(key string, item I) bool {
			if holds != nil && !holds(key, item) {
				return true
			}
			cur.keys, cur.items = append(cur.keys, key), append(cur.items, item)
			if len(cur.keys) < size {
				return true
			}
			select {
			case chunks <- cur:
			case <-rctx.Done():
				return false
			}
			cur = aheadChunk[I]{keys: make([]string, 0, size), items: make([]I, 0, size)}
			return true
		})
		if err == nil && len(cur.keys) > 0 {
			select {
			case chunks <- cur:
			case <-rctx.Done():
			}
		}
		srcErr <- err
	}()
	var loopErr error
	for c := range chunks {
		b.yielded += int64(len(c.keys))
		b.keys, b.items = c.keys, c.items
		if loopErr = b.flush(ctx); loopErr != nil {
			break
		}
	}
	stop()
	for range chunks { // let the reader end
	}
	err := <-srcErr
	if p, ok := err.(readerPanic); ok {
		panic(fmt.Sprintf("%v\n\nin the source of batch step %s, read ahead on another goroutine:\n%s", p.value, b.name, p.stack))
	}
	if loopErr != nil {
		return loopErr // the reader's error, if any, comes of being stopped
	}
	if err == nil && ctx.Err() != nil {
		// Cancelled, the reader may have dropped a chunk it held: the
		// step did not see every item, so it must not be recorded done.
		return fmt.Errorf("%w while reading ahead in batch step %s: %w", ErrInterrupted, b.name, context.Cause(ctx))
	}
	return err
}

// readerPanic is a panic of the read-ahead goroutine, carried to the
// batch's own goroutine with the reader's stack.
type readerPanic struct {
	value any
	stack []byte
}

func (p readerPanic) Error() string { return fmt.Sprint(p.value) }
