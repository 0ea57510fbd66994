package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/cache/shared"
	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/store/redisstore"
)

// redisStore is the "redis" store kind wired up: one client shared by the
// submission index (behind a fail-open Failover) and the answers' Redis
// level (under the in-memory cache).
type redisStore struct {
	Client   redis.UniversalClient
	Index    *redisstore.Index
	Failover *store.Failover // the store.Index intercept uses
	Answers  *shared.Answers // the Redis level of the answer cache
	Cache    *shared.Tiered  // the intercept.AnswerCache intercept uses
}

// startupPingTimeout bounds the check of Redis at start-up.
const startupPingTimeout = 2 * time.Second

// newRedisStore connects to the Redis of cfg.Store and builds the shared
// index and answer cache over it, with l1 as the in-memory answer level.
// An unreachable Redis is not an error: solveonce starts degraded
// (deduplicating within this process) and switches to Redis when it
// answers; the warning names the problem.
func newRedisStore(cfg config.File, environ []string, l1 *cache.Answers, log *slog.Logger) (*redisStore, error) {
	rdb, err := newRedisClient(cfg.Store, lookupEnv(environ, config.EnvRedisPassword))
	if err != nil {
		return nil, err
	}
	idx := redisstore.New(rdb, cfg.Store.Prefix)
	fo := store.NewFailover(idx, store.FailoverConfig{
		Timeout: cfg.Store.Timeout,
		Local:   cfg.Store.Memory,
		OnChange: func(degraded bool, err error) {
			if degraded {
				log.Warn("Redis unavailable: deduplicating within this replica until it answers", "err", err)
			} else {
				log.Info("Redis answers again: sharing deduplication with the other replicas")
			}
		},
	})
	rs := &redisStore{
		Client:   rdb,
		Index:    idx,
		Failover: fo,
		Answers:  shared.New(rdb, shared.Config{Prefix: cfg.Store.Prefix, Timeout: cfg.Store.Timeout}),
	}
	rs.Cache = shared.NewTiered(l1, rs.Answers)

	ctx, cancel := context.WithTimeout(context.Background(), startupPingTimeout)
	defer cancel()
	if err := fo.PingPrimary(ctx); err != nil {
		log.Warn("Redis not reachable at start-up; starting degraded", "url", redactURL(cfg.Store.RedisURL), "err", err)
	}
	return rs, nil
}

// close stops the prober and the pub/sub connection, then closes the
// client. Call it after the intercept layer has finished its work.
func (rs *redisStore) close() {
	_ = rs.Failover.Close()
	_ = rs.Index.Close()
	_ = rs.Client.Close()
}

// newRedisClient returns a client for the deployment that redis_url
// describes, in go-redis's own URL conventions:
//
//   - redis://host:port/db (rediss:// for TLS): one server;
//   - redis://sentinel:26379/db?master_name=mymaster&addr=sentinel2:26379:
//     a Sentinel-managed master (the host and every addr are sentinels);
//   - redis://node:6379?addr=node2:6379&addr=node3:6379, or one node with
//     cluster=true: a Redis Cluster (all the given nodes are seeds).
//
// Each is one of go-redis's UniversalClient implementations, the same ones
// redis.NewUniversalClient picks; the parsers keep every URL option
// (pool_size, dial_timeout, …). The password, when given, comes from
// SOLVEONCE_REDIS_PASSWORD (it overrides one in the URL); a sentinel's own
// password can only come from the URL's user info, so set the whole URL
// from the environment (SOLVEONCE_STORE_REDIS_URL) in that case.
//
// Timeouts the URL leaves unset are made short, and every command honours
// its context's deadline, so the Failover's timeout governs.
func newRedisClient(sc config.Store, password string) (redis.UniversalClient, error) {
	u, err := url.Parse(sc.RedisURL)
	if err != nil {
		return nil, errors.New("store.redis_url: not a URL")
	}
	timeout := sc.Timeout
	if timeout <= 0 {
		timeout = store.DefaultFailoverTimeout
	}
	q := u.Query()
	cluster, _ := strconv.ParseBool(q.Get("cluster"))
	bad := func(err error) error {
		return fmt.Errorf("store.redis_url %s: %w", redactURL(sc.RedisURL), err)
	}
	switch {
	case q.Has("master_name"):
		o, err := redis.ParseFailoverURL(sc.RedisURL)
		if err != nil {
			return nil, bad(err)
		}
		if password != "" {
			o.Password = password
		}
		o.ContextTimeoutEnabled = true
		shorten(timeout, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
		return redis.NewFailoverClient(o), nil
	case q.Has("addr") || cluster:
		q.Del("cluster")
		u.RawQuery = q.Encode()
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, bad(err)
		}
		if password != "" {
			o.Password = password
		}
		o.ContextTimeoutEnabled = true
		shorten(timeout, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
		return redis.NewClusterClient(o), nil
	default:
		o, err := redis.ParseURL(sc.RedisURL)
		if err != nil {
			return nil, bad(err)
		}
		if password != "" {
			o.Password = password
		}
		o.ContextTimeoutEnabled = true
		shorten(timeout, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
		return redis.NewClient(o), nil
	}
}

// shorten sets the client timeouts the URL left unset (zero): a
// connection (TLS included) gets a little more than one operation's time,
// reads, writes and the wait for a pooled connection get op. The operation
// itself still gives up at its context's deadline.
func shorten(op time.Duration, dial, read, write, pool *time.Duration) {
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{{dial, max(op, time.Second)}, {read, op}, {write, op}, {pool, op}} {
		if *d.p == 0 {
			*d.p = d.def
		}
	}
}

// redactURL returns raw with any password replaced by "xxxxx", for logs
// and errors.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	q := u.Query()
	for _, k := range []string{"password", "sentinel_password"} {
		if q.Has(k) {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.Redacted()
}

// storeFailover returns the fail-open wrapper of the shared index, or nil
// when the store is in memory. Metrics and readiness read its Stats,
// Degraded and Err.
func (a *app) storeFailover() *store.Failover {
	f, _ := a.index.(*store.Failover)
	return f
}
