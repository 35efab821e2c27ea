-- Raise a group's term counter to ARGV[1] if it is lower; never lower it.
-- KEYS: term
-- Returns 1 if raised, 0 if left alone.
local stored = tonumber(redis.call('GET', KEYS[1]) or '0')
if stored < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
