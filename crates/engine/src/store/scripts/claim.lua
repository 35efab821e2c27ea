-- Claim a group's lease.
-- KEYS: lease, term, members, config, born, the claimant's node hash,
--       replid (the replication id of the primary the store was last used on)
-- ARGV: node id, incarnation, ttl ms, highest term this node has seen, candidacy ms
-- Returns {1, term, fresh, config} when this node holds the lease afterwards
-- (fresh = 1 for a new acquisition, 0 when it kept a lease it already held),
-- or {0, term, pttl ms, holder id, config} when another node holds it, or
-- another incarnation of this node id that is the registered one (this
-- claimant is an older process, or one not registered yet: either way it
-- must not take the lease; the heartbeat sorts out which is which).
-- config is {ttlMs, renewIntervalMs, retryIntervalMs} from the group's
-- config hash (written by the controller), so nodes pick up new timings at
-- their next claim without another call.
--
-- born is the store's birth, in Redis ms: set by the first claim made under
-- this prefix, and so again after Redis lost its data. For one ttl after it
-- no lease is newly handed out ({0, term, ms left, '', config}): a leader
-- whose lease was lost with the data may still lead by its local view for
-- up to one ttl, and a second leader must not start meanwhile. Claims made
-- in that time also lift the term counter to the highest term the
-- claimants remember, so terms do not restart from 1 either.
-- The birth recorded is Redis's own start (the latest its uptime allows),
-- not the first claim: a leader that Redis forgot by restarting empty
-- renewed before that start, so one ttl from it is enough; and a store
-- first used on a Redis that has been up for longer than a ttl (a fresh
-- install) hands out its first lease at once.
local mine = ARGV[1] .. '#' .. ARGV[2] .. '#'
local ttl = tonumber(ARGV[3])
local seen = tonumber(ARGV[4])
local now = now_ms()
local born = tonumber(redis.call('GET', KEYS[5]) or '-1')
if born < 0 then
  -- INFO is in the @dangerous ACL category: a user without it gets the
  -- older, longer rule (the birth is this first claim).
  local info = redis.pcall('INFO', 'server')
  local uptime = 0
  if type(info) == 'string' then
    uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0')
  end
  -- uptime_in_seconds is the difference of two whole-second clocks, so it
  -- can exceed the true uptime by up to a second: the latest start it
  -- allows is a second later than it says (and never later than now).
  born = math.min(now, now - uptime * 1000 + 1000)
  redis.call('SET', KEYS[5], born)
end
-- The store's history: a promoted replica, or a restarted primary, has a
-- new master_replid. A lease written on the old primary may be missing
-- here while its holder still leads by its local view, so such a store is
-- born again now: no lease for one ttl, while claims lift the term counter
-- to what the nodes remember. (No INFO for this user: not detected.)
local repl = redis.pcall('INFO', 'replication')
if type(repl) == 'string' then
  local replid = string.match(repl, 'master_replid:(%w+)')
  if replid then
    local known = redis.call('GET', KEYS[7])
    if known and known ~= replid then
      born = now
      redis.call('SET', KEYS[5], now)
    end
    if known ~= replid then redis.call('SET', KEYS[7], replid) end
  end
end
local config = redis.call('HMGET', KEYS[4], 'ttlMs', 'renewIntervalMs', 'retryIntervalMs')
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #mine) == mine then
  -- Our own lease, still standing after a fail-safe demotion: nobody else
  -- could have held it in between, so it keeps its term.
  local term = tonumber(string.sub(current, #mine + 1))
  if term > stored then redis.call('SET', KEYS[2], term) end
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, term, 0, config}
end
if seen > stored then
  -- Only after a data loss: remember what this node has seen.
  stored = seen
  redis.call('SET', KEYS[2], stored)
end
if current and holder_id(current) ~= ARGV[1] then
  return {0, stored, redis.call('PTTL', KEYS[1]), holder_id(current), config}
end
if current then
  -- Held by another incarnation of this id. Only the registered (newest)
  -- incarnation may take it over; an unregistered id (swept, or Redis lost
  -- the registry) is an unclean restart and may too.
  local registered = redis.call('HGET', KEYS[6], 'incarnation')
  if registered and registered ~= ARGV[2] then
    return {0, stored, redis.call('PTTL', KEYS[1]), ARGV[1], config}
  end
end
if now - born < ttl then
  return {0, stored, born + ttl - now, '', config}
end
-- Free, or held by an earlier incarnation of this node id (an unclean restart
-- with a stable id): a new acquisition, under a term larger than any before.
local term = stored + 1
redis.call('SET', KEYS[2], term)
redis.call('SET', KEYS[1], mine .. term, 'PX', ttl)
return {1, term, 1, config}
