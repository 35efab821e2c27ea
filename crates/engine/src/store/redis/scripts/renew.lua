-- Renew a held lease (compare-and-expire).
-- KEYS: lease, members, config, term, epoch (the store's term epoch),
--       priorities (seat.lua)
-- ARGV: node id, incarnation, term, ttl ms, candidacy ms, wake channel
--       (P:g:{G}:released), "1" to hint the followers, priority, problem
--       (seat.lua)
-- Returns {1, config, term} renewed (config as in claim.lua; term is the
-- lease's term afterwards), {0} the lease is gone (expired), {-1, lease
-- value} another holder.
-- If the term counter is ahead of the lease's term (the controller restored
-- a term Redis had lost, after this lease was taken at a low term), the
-- lease moves to a new term above the counter, so terms never go backwards
-- as anyone observes them; if that term's epoch may not be granted yet
-- (terms.lua), at a later renewal.
-- A hint ('renewed TERM TTL' on the wake channel) tells the followers how
-- long the lease now stands, so they sleep on without a claim; the engine's
-- rules.rs says which renewals hint.
local lease_key = KEYS[1]
local members_key = KEYS[2]
local config_key = KEYS[3]
local term_key = KEYS[4]
local epoch_key = KEYS[5]
local priorities_key = KEYS[6]
local id = ARGV[1]
local incarnation = ARGV[2]
local held_term = ARGV[3]
local ttl_ms = ARGV[4]
local candidacy_ms = tonumber(ARGV[5])
local wake_channel = ARGV[6]
local hint = ARGV[7]
local priority = tonumber(ARGV[8])
local problem = ARGV[9]
local mine = id .. '#' .. incarnation .. '#'
local current = redis.call('GET', lease_key)
if current == mine .. held_term then
  local now = now_ms()
  local ttl = tonumber(ttl_ms)
  local term = tonumber(held_term)
  local counter = tonumber(redis.call('GET', term_key) or '0')
  -- Above the store's epoch too: a lease kept across a change of history
  -- must not move to a term of the old history's that may have been
  -- granted already.
  local epoch = tonumber(redis.call('GET', epoch_key) or '0')
  local moved = next_term(math.max(counter, epoch * TERM_SPAN))
  if counter > term and epoch_wait(moved, now) == 0 then
    term = moved
    redis.call('SET', term_key, term_text(term))
    redis.call('SET', lease_key, mine .. term_text(term), 'PX', ttl)
  else
    redis.call('PEXPIRE', lease_key, ttl)
  end
  redis.call('ZADD', members_key, now + candidacy_ms, id)
  keep_priority(priorities_key, id, priority, problem)
  -- The leader keeps the member list tidy: drop candidacies that lapsed.
  drop_lapsed(members_key, priorities_key, now)
  if hint == '1' then
    redis.call('PUBLISH', wake_channel, 'renewed ' .. term_text(term) .. ' ' .. ttl_ms)
  end
  return {1, redis.call('HMGET', config_key, 'ttlMs', 'renewIntervalMs', 'retryIntervalMs'), term}
end
if not current then return {0} end
return {-1, current}
