-- Record one Kubernetes cluster's timings for a group, and read every
-- cluster's: the controllers of clusters that share the store compare them
-- before any of them writes the group's timings (docs/clusters.md).
-- KEYS: specs
-- ARGV: cluster, ttl ms, renew interval ms, retry interval ms, refresh ms
-- Returns {now ms, {cluster, 'TTL RENEW RETRY AT', ...}}: the record is
-- written when its timings changed or it is `refresh` ms old or older.
local specs_key = KEYS[1]
local cluster = ARGV[1]
local ttl = ARGV[2]
local renew = ARGV[3]
local retry = ARGV[4]
local refresh = tonumber(ARGV[5])
local timings = ttl .. ' ' .. renew .. ' ' .. retry
local now = now_ms()
local old = redis.call('HGET', specs_key, cluster)
local stale = true
if old then
  local old_timings, at = string.match(old, '^(.*) (%d+)$')
  stale = old_timings ~= timings or now - tonumber(at or '0') >= refresh
end
if stale then
  redis.call('HSET', specs_key, cluster, timings .. ' ' .. now)
end
return {now, redis.call('HGETALL', specs_key)}
