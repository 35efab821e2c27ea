-- Raise a group's term counter to the given term if it is lower; never
-- lower it.
-- KEYS: term
-- ARGV: term
-- Returns 1 if raised, 0 if left alone.
local term_key = KEYS[1]
local term = ARGV[1]
local stored = tonumber(redis.call('GET', term_key) or '0')
if stored < tonumber(term) then
  redis.call('SET', term_key, term)
  return 1
end
return 0
