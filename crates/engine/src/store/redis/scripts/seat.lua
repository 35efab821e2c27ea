-- Shared by the lease scripts: a candidate's priority, kept beside its
-- candidacy, and who may take a free seat (docs/behaviour.md P1-P4).
-- DEFAULT_PRIORITY comes from config.rs (scripts.rs writes it above).
--
-- Priorities live in P:g:{G}:priorities (node id -> priority), and only
-- those other than the default: a group whose members all campaign with
-- the default has no such key, and its free seat costs one EXISTS more.
-- A member whose application is unhealthy campaigns with priority 0 and
-- its reason: the value is then '0 REASON' (read by `priority_of`).
-- P:g:{G}:seat holds what the free seat's rules need: `last`, the holder
-- of the latest lease (never waited for: it had the seat and let it go, by
-- a release or by not renewing); `vacant`, when a claim first deferred on
-- the free seat (the deference counts from there); `successor` and
-- `until`, a named successor and the end of its handover window. A grant
-- sets `last` and clears the rest.

local function keep_priority(key, id, priority, problem)
  local value = tostring(priority)
  if problem and problem ~= '' then value = '0 ' .. problem end
  if value == tostring(DEFAULT_PRIORITY) then
    redis.call('HDEL', key, id)
  elseif redis.call('HGET', key, id) ~= value then
    redis.call('HSET', key, id, value)
  end
end

-- The priority in a value of the priorities hash.
local function priority_of(value)
  if not value then return DEFAULT_PRIORITY end
  return tonumber(string.match(value, '^%d+')) or DEFAULT_PRIORITY
end

-- Removes the candidacies that lapsed, with their priorities.
local function drop_lapsed(members, priorities, now)
  local gone = redis.call('ZRANGEBYSCORE', members, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
    -- In slices: unpack takes a few thousand values at most.
    for i = 1, #gone, 1000 do
      redis.call('HDEL', priorities, unpack(gone, i, math.min(i + 999, #gone)))
    end
  end
end

-- Whether the claimant `id` (of `priority`) must leave the free seat to a
-- better candidate: nil when it may take it, else {ms to wait, reason,
-- the candidate waited for}. The deference lasts at most `defer_ms` from
-- the first claim that deferred, so a better candidate that does not
-- claim (dead, with its candidacy not yet lapsed) cannot keep the seat
-- empty for longer.
local function seat_deferral(members, priorities, seat, config, id, priority, now, defer_ms)
  if priority <= 0 then return {defer_ms, 'neverLeads', ''} end
  local s = redis.call('HMGET', seat, 'last', 'vacant', 'successor', 'until')
  local last, successor, until_ms = s[1], s[3], tonumber(s[4] or '0')
  if successor and now < until_ms then
    if successor == id then return nil end
    local score = redis.call('ZSCORE', members, successor)
    if score and tonumber(score) > now then return {until_ms - now, 'successor', successor} end
  end
  local preferred_text = redis.call('HGET', config, 'preferred')
  if not preferred_text and redis.call('EXISTS', priorities) == 0 then return nil end
  local preferred = nil
  if preferred_text then
    preferred = {}
    for node in string.gmatch(preferred_text, '%S+') do preferred[node] = true end
  end
  local prios = {}
  local flat = redis.call('HGETALL', priorities)
  for i = 1, #flat, 2 do prios[flat[i]] = priority_of(flat[i + 1]) end
  -- Priority first; among equals, the preferred ones (all, without a list).
  local function rank(node, p)
    if p <= 0 then return 0 end
    if not preferred or preferred[node] then return p * 2 + 1 end
    return p * 2
  end
  local best, best_rank, best_priority = nil, rank(id, priority), priority
  for _, node in ipairs(redis.call('ZRANGEBYSCORE', members, '(' .. now, '+inf')) do
    if node ~= id and node ~= last then
      local p = prios[node] or DEFAULT_PRIORITY
      local r = rank(node, p)
      if r > best_rank then best, best_rank, best_priority = node, r, p end
    end
  end
  if not best then return nil end
  local vacant = tonumber(s[2] or '-1')
  if vacant < 0 or vacant > now then
    vacant = now
    redis.call('HSET', seat, 'vacant', now)
  end
  if now >= vacant + defer_ms then return nil end
  local reason = 'preferred'
  if best_priority > priority then reason = 'priority' end
  return {vacant + defer_ms - now, reason, best}
end

-- A new lease for `id`: it is the last holder now, and what the free seat
-- waited for is over.
local function seat_taken(seat, id)
  redis.call('HSET', seat, 'last', id)
  redis.call('HDEL', seat, 'vacant', 'successor', 'until')
end
