package intercept

import (
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := t0.UnixMilli()
	always := Policy{Reuse: ReuseAlways}.withDefaults()
	orphans := Policy{Reuse: ReuseOrphans, Window: 80 * time.Second, OrphanAfter: 30 * time.Second}.withDefaults()
	task := func(h hold, created, touched time.Duration) entry {
		return entry{Task: "123", Hold: h, Created: ms - created.Milliseconds(), Touched: ms - touched.Milliseconds(), Window: 80_000}
	}
	pending := func(h hold) entry {
		return entry{Pending: true, Owner: "other", Hold: h, Created: ms - 1000, Touched: ms - 1000}
	}
	cases := []struct {
		name    string
		cur     entry
		ok      bool
		pol     Policy
		payload string
		fresh   bool
		want    action
		write   bool
		hold    hold
	}{
		{name: "absent: lead", pol: always, want: actLead, write: true},
		{name: "failed marker: lead again", cur: entry{Failed: true, Owner: "x"}, ok: true, pol: always, want: actLead, write: true},
		{name: "always: task in window reused", cur: task(holdFetched, time.Minute, time.Minute), ok: true, pol: always, want: actReuse},
		{name: "always: window over: lead", cur: task(holdFree, 11*time.Minute, time.Minute), ok: true, pol: always, want: actLead, write: true},
		{name: "always: pending joined", cur: pending(holdWaiting), ok: true, pol: always, want: actWait},
		{name: "fresh (no-cache) always leads", cur: task(holdFree, time.Second, time.Second), ok: true, pol: always, fresh: true, want: actLead, write: true},
		{name: "orphans: undelivered task reused", cur: task(holdFree, 10*time.Second, 10*time.Second), ok: true, pol: orphans, want: actReuse, write: true, hold: holdWaiting},
		{name: "orphans: delivered and polled recently: own task", cur: task(holdDelivered, 20*time.Second, 5*time.Second), ok: true, pol: orphans, want: actLead, write: true},
		{name: "orphans: delivered but silent past orphan_after: reused", cur: task(holdDelivered, 50*time.Second, 31*time.Second), ok: true, pol: orphans, want: actReuse, write: true, hold: holdWaiting},
		{name: "orphans: fetched never reused", cur: task(holdFetched, 50*time.Second, 45*time.Second), ok: true, pol: orphans, want: actLead, write: true},
		{name: "orphans: window over", cur: task(holdFree, 81*time.Second, 81*time.Second), ok: true, pol: orphans, want: actLead, write: true},
		{name: "orphans: waiting holder alive: own task", cur: task(holdWaiting, 2*time.Second, 2*time.Second), ok: true, pol: orphans, want: actLead, write: true},
		{name: "orphans: pending held by a live client: independent", cur: pending(holdWaiting), ok: true, pol: orphans, want: actIndependent},
		{name: "orphans: pending whose client left: join", cur: pending(holdFree), ok: true, pol: orphans, want: actWait, write: true, hold: holdWaiting},
		{name: "idempotency payload mismatch", cur: entry{Task: "1", Payload: "a", Created: ms, Window: 600_000}, ok: true, pol: always, payload: "b", want: actMismatch},
		{name: "idempotency payload match", cur: entry{Task: "1", Payload: "a", Created: ms, Window: 600_000}, ok: true, pol: always, payload: "a", want: actReuse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, next, write := decide(c.cur, c.ok, c.pol, c.payload, "me", t0, c.fresh)
			if d.act != c.want {
				t.Fatalf("action = %d, want %d", d.act, c.want)
			}
			if write != c.write {
				t.Fatalf("write = %v, want %v", write, c.write)
			}
			if c.want == actLead {
				if !next.Pending || next.Owner != "me" || next.Window != c.pol.Window.Milliseconds() {
					t.Fatalf("lead must store our claim, got %+v", next)
				}
			}
			if write && c.want != actLead && next.Hold != c.hold {
				t.Fatalf("hold = %d, want %d", next.Hold, c.hold)
			}
		})
	}
}

func TestReuseText(t *testing.T) {
	for _, s := range []string{"always", "orphans", "never"} {
		var r Reuse
		if err := r.UnmarshalText([]byte(s)); err != nil || r.String() != s {
			t.Fatalf("%q: %v %v", s, r, err)
		}
	}
	var r Reuse
	if err := r.UnmarshalText([]byte("sometimes")); err == nil {
		t.Fatal("want error for unknown reuse")
	}
}
