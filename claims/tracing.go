package claims

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/transport"
)

// The spans of a claim (docs/OPERATIONS.md, Tracing), made when
// GroupConfig.Tracer is set, and only inside a traced request: the
// monitor's own proposals (expiries, promotions) are not traced.
const (
	// SpanPropose is one proposal by the partition's leader (ProposeContext):
	// appended, replicated, committed and applied on the leader.
	// Attributes norn.partition, norn.op (claim, renew, ...),
	// norn.tasks (the command's tasks).
	SpanPropose = "norn.claims.propose"
	// SpanApply is the apply of a traced entry on one replica of the
	// group (each cohort member's FSM, the leader's included): a child
	// of the proposal's span, whose context the entry carries in its
	// Extensions. Attributes norn.partition, norn.op, norn.tasks,
	// norn.raft.index.
	SpanApply = "norn.claims.apply"
)

// The attributes of the claim spans.
const (
	AttrPartition = attribute.Key("norn.partition")
	AttrOp        = attribute.Key("norn.op")
	AttrTasks     = attribute.Key("norn.tasks")
	AttrRaftIndex = attribute.Key("norn.raft.index")
)

// cmdAttrs are the attributes of a command's spans.
func cmdAttrs(p uint16, cmd *Command) []attribute.KeyValue {
	return []attribute.KeyValue{AttrPartition.Int(int(p)), AttrOp.String(cmd.Op.String()), AttrTasks.Int(cmd.tasks())}
}

// ProposeContext is Propose inside a request: when the group traces
// (GroupConfig.Tracer) and ctx holds a span, the proposal has a span
// (SpanPropose), and a sampled one's context travels in the entry's
// Extensions (transport.AppendTraceContext) to every replica's apply
// (SpanApply). A replica of an older version ignores Extensions.
func (g *Group) ProposeContext(ctx context.Context, cmd *Command, timeout time.Duration) ([]Outcome, error) {
	if g.tracer == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return g.propose(nil, cmd, timeout)
	}
	_, span := g.tracer.Start(ctx, SpanPropose, trace.WithAttributes(cmdAttrs(g.p, cmd)...))
	var ext []byte
	if sc := span.SpanContext(); sc.IsSampled() {
		ext = transport.AppendTraceContext(nil, sc)
	}
	outs, err := g.propose(ext, cmd, timeout)
	transport.EndSpan(span, err)
	return outs, err
}

// startApply starts the apply span of entry l holding cmd, when the group
// traces and l carries a trace context; nil otherwise.
func (f *fsm) startApply(l *raft.Log, cmd *Command) trace.Span {
	if f.tracer == nil || len(l.Extensions) == 0 {
		return nil
	}
	sc, ok := transport.ParseTraceContext(l.Extensions)
	if !ok {
		return nil
	}
	attrs := append(cmdAttrs(f.p, cmd), AttrRaftIndex.Int64(int64(l.Index)))
	_, span := f.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), sc), SpanApply, trace.WithAttributes(attrs...))
	return span
}

// tracedApply is an apply span and the result it ends with.
type tracedApply struct {
	span trace.Span
	res  *Result
}

// tasks is the number of tasks cmd is about.
func (c *Command) tasks() int {
	switch {
	case len(c.Candidates) > 0:
		return len(c.Candidates)
	case len(c.IDs) > 0:
		return len(c.IDs)
	case len(c.Ends) > 0:
		return len(c.Ends)
	case c.ID != 0:
		return 1
	}
	return 0
}
