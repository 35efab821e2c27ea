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
local mine = ARGV[1] .. '#' .. ARGV[2] .. '#'
local current = redis.call('GET', KEYS[1])
if current == mine .. ARGV[3] then
  local now = now_ms()
  local ttl = tonumber(ARGV[4])
  local term = tonumber(ARGV[3])
  local counter = tonumber(redis.call('GET', KEYS[4]) or '0')
  -- Above the store's epoch too: a lease kept across a change of history
  -- must not move to a term of the old history's that may have been
  -- granted already.
  local epoch = tonumber(redis.call('GET', KEYS[5]) or '0')
  local moved = next_term(math.max(counter, epoch * TERM_SPAN))
  if counter > term and epoch_wait(moved, now) == 0 then
    term = moved
    redis.call('SET', KEYS[4], term_text(term))
    redis.call('SET', KEYS[1], mine .. term_text(term), 'PX', ttl)
  else
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
  keep_priority(KEYS[6], ARGV[1], tonumber(ARGV[8]), ARGV[9])
  -- The leader keeps the member list tidy: drop candidacies that lapsed.
  drop_lapsed(KEYS[2], KEYS[6], now)
  if ARGV[7] == '1' then
    redis.call('PUBLISH', ARGV[6], 'renewed ' .. term_text(term) .. ' ' .. ARGV[4])
  end
  return {1, redis.call('HMGET', KEYS[3], 'ttlMs', 'renewIntervalMs', 'retryIntervalMs'), term}
end
if not current then return {0} end
return {-1, current}
