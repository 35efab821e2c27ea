-- Shared prologue: the Redis server's clock in milliseconds. Every expiry the
-- engine decides on is measured with this clock, never a client's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A lease value is "NODE_ID#INCARNATION#TERM"; node ids never contain "#".
local function holder_id(value)
  local sep = string.find(value, '#', 1, true)
  if sep then return string.sub(value, 1, sep - 1) end
  return value
end
