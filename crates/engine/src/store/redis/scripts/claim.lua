-- Claim a group's lease.
-- KEYS: lease, term, members, config, born, the claimant's node hash,
--       history (the identity of the server process and replication
--       history the store was last used on), epoch (the store's term epoch),
--       priorities, seat (seat.lua)
-- ARGV: node id, incarnation, ttl ms, highest term this node has seen,
--       candidacy ms (how long the membership lasts: the caller passes ttl +
--       two retry intervals), priority, deference ms, problem ('' or why
--       the application is unhealthy; seat.lua)
-- Returns {1, term, fresh, config} when this node holds the lease afterwards
-- (fresh = 1 for a new acquisition, 0 when it kept a lease it already held),
-- or {0, term, pttl ms, holder id, config} when another node holds it, or
-- another incarnation of this node id that is the registered one (this
-- claimant is an older process, or one not registered yet: either way it
-- must not take the lease; the heartbeat sorts out which is which), or
-- {0, term, ms to wait, '', config, reason, candidate} when the seat is
-- free but this node leaves it to a better candidate (seat.lua).
-- config is {ttlMs, renewIntervalMs, retryIntervalMs} from the group's
-- config hash (written by the controller), so nodes pick up new timings at
-- their next claim without another call.
--
-- born is the store's birth, in Redis ms: set by the first claim made under
-- this prefix, and again whenever the store's history changes. For one ttl
-- after it no lease is newly handed out ({0, term, ms left, '', config}): a
-- leader whose lease was lost with the data may still lead by its local
-- view for up to one ttl, and a second leader must not start meanwhile.
-- Claims made in that time also lift the term counter to the highest term
-- the claimants remember.
-- The birth recorded is Redis's own start (the latest its uptime allows),
-- not the first claim: a leader that Redis forgot by restarting empty
-- renewed before that start, so one ttl from it is enough; and a store
-- first used on a Redis that has been up for longer than a ttl (a fresh
-- install) hands out its first lease without that wait. A claimant that
-- remembers a term the data lacks proves that the data was lost, or that
-- this server's data is a branch that an earlier failover left behind (a
-- primary never demoted, found again): the store is born again then too.
--
-- Terms come from the store's epoch (terms.lua): a new history starts a new
-- epoch from the Redis clock, above the stored one, and its first term
-- waits for the epoch's hold, so no term of an earlier history, even one
-- nobody alive saw, is granted again. Until then the reply is
-- {0, term, ms left, '', config} too, as in the first ttl.
local lease_key = KEYS[1]
local term_key = KEYS[2]
local members_key = KEYS[3]
local config_key = KEYS[4]
local born_key = KEYS[5]
local node_key = KEYS[6]
local history_key = KEYS[7]
local epoch_key = KEYS[8]
local priorities_key = KEYS[9]
local seat_key = KEYS[10]
local id = ARGV[1]
local incarnation = ARGV[2]
local ttl = tonumber(ARGV[3])
local seen = tonumber(ARGV[4])
local candidacy_ms = tonumber(ARGV[5])
local priority = tonumber(ARGV[6])
local defer_ms = tonumber(ARGV[7])
local problem = ARGV[8]
local mine = id .. '#' .. incarnation .. '#'
local now = now_ms()
-- INFO is in the @dangerous ACL category: a user without it cannot tell a
-- new history by the server (only by the data: born and epoch missing).
local function info(...)
  local text = redis.pcall('INFO', ...)
  if type(text) == 'string' then return text end
  return nil
end
local text = info('server', 'replication')
if not text then
  -- Before Redis 7, INFO takes one section.
  local server, replication = info('server'), info('replication')
  if server and replication then text = server .. replication end
end
local born = tonumber(redis.call('GET', born_key) or '-1')
if born < 0 then
  local uptime = nil
  if text then uptime = tonumber(string.match(text, 'uptime_in_seconds:(%d+)') or '') end
  if not uptime then
    born = now
  else
    -- uptime_in_seconds is the difference of two whole-second clocks, so
    -- it can exceed the true uptime by up to a second: the latest start it
    -- allows is a second later than it says (and never later than now).
    born = math.min(now, now - uptime * 1000 + 1000)
  end
  redis.call('SET', born_key, born)
end
-- The store's epoch: missing on a store never used, flushed, or written
-- before epochs; a new one after a change of history.
local stored_epoch = tonumber(redis.call('GET', epoch_key) or '-1')
local epoch = stored_epoch
if epoch < 0 then epoch = epoch_at(now) end
-- The store's history: a restarted server has a new run_id (and, whatever
-- it loaded, may lack leases and terms it granted), a promoted replica a
-- new master_replid. Either way the store is born again now: no lease for
-- one ttl, while claims lift the term counter to what the nodes remember,
-- and a new epoch. (No INFO for this user: not detected.)
local function born_again(above)
  born = now
  redis.call('SET', born_key, now)
  epoch = math.max(epoch, epoch_at(now), above + 1)
end
local moved_on = false
if text then
  local run = string.match(text, 'run_id:(%w+)')
  local replid = string.match(text, 'master_replid:(%w+)')
  if run and replid then
    local history = run .. ':' .. replid
    local known = redis.call('GET', history_key)
    if known and known ~= history then
      born_again(stored_epoch)
      moved_on = true
    end
    if known ~= history then redis.call('SET', history_key, history) end
  end
end
local stored = tonumber(redis.call('GET', term_key) or '0')
if seen > stored then
  -- Only after a data loss, or on a branch of history left behind:
  -- remember what this node has seen, and hold leases back as after a
  -- restart (a holder of that term may still lead by its local view), in
  -- an epoch above the one of the term seen (later terms of it may be
  -- lost too). Only once in a claim that already found a new server: the
  -- epoch must not run ahead of the clock one step per claimant.
  local seen_epoch = math.floor(seen / TERM_SPAN)
  if moved_on then
    epoch = math.max(epoch, seen_epoch + 1)
  else
    born_again(seen_epoch)
  end
  stored = seen
  redis.call('SET', term_key, term_text(stored))
end
if epoch ~= stored_epoch then redis.call('SET', epoch_key, term_text(epoch)) end
local config = redis.call('HMGET', config_key, 'ttlMs', 'renewIntervalMs', 'retryIntervalMs')
redis.call('ZADD', members_key, now + candidacy_ms, id)
keep_priority(priorities_key, id, priority, problem)
local current = redis.call('GET', lease_key)
if current and string.sub(current, 1, #mine) == mine then
  -- Our own lease, still standing after a fail-safe demotion: nobody else
  -- could have held it in between, so it keeps its term.
  local term = tonumber(string.sub(current, #mine + 1))
  if term > stored then redis.call('SET', term_key, term_text(term)) end
  redis.call('PEXPIRE', lease_key, ttl)
  return {1, term, 0, config}
end
if current and holder_id(current) ~= id then
  return {0, stored, redis.call('PTTL', lease_key), holder_id(current), config}
end
if current then
  -- Held by another incarnation of this id. Only the registered (newest)
  -- incarnation may take it over; an unregistered id (swept, or Redis lost
  -- the registry) is an unclean restart and may too.
  local registered = redis.call('HGET', node_key, 'incarnation')
  if registered and registered ~= incarnation then
    return {0, stored, redis.call('PTTL', lease_key), id, config}
  end
end
if now - born < ttl then
  return {0, stored, born + ttl - now, '', config}
end
local deferral = seat_deferral(members_key, priorities_key, seat_key, config_key, id, priority,
  now, defer_ms)
if deferral then
  return {0, stored, deferral[1], '', config, deferral[2], deferral[3]}
end
-- Free, or held by an earlier incarnation of this node id (an unclean restart
-- with a stable id): a new acquisition, under a term larger than any before,
-- in the store's epoch at least.
local term = next_term(math.max(stored, epoch * TERM_SPAN))
local wait = epoch_wait(term, now)
if wait > 0 then
  return {0, stored, wait, '', config}
end
redis.call('SET', term_key, term_text(term))
redis.call('SET', lease_key, mine .. term_text(term), 'PX', ttl)
seat_taken(seat_key, id)
return {1, term, 1, config}
