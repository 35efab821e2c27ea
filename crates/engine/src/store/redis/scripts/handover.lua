-- Release a lease to a named successor (step-down --to): as release.lua,
-- but only when the successor is a live member that may lead, and then
-- the other candidates leave the free seat to it until the window ends
-- (seat.lua). The wake-up says whom the seat went to
-- ('handover SUCCESSOR'), so the successor claims even while it abstains
-- after a step-down of its own.
-- KEYS: lease, members, priorities, seat
-- ARGV: node id, incarnation, term, wake channel (P:g:{G}:released),
--       successor id, window ms
-- Returns 1 released, 0 the lease is not ours (nothing changed), -1 the
-- successor is not a live member, -2 it campaigns with priority 0 (in
-- both cases the leader keeps its lease).
local lease_key = KEYS[1]
local members_key = KEYS[2]
local priorities_key = KEYS[3]
local seat_key = KEYS[4]
local id = ARGV[1]
local incarnation = ARGV[2]
local term = ARGV[3]
local wake_channel = ARGV[4]
local successor = ARGV[5]
local window_ms = tonumber(ARGV[6])
local now = now_ms()
if redis.call('GET', lease_key) ~= id .. '#' .. incarnation .. '#' .. term then return 0 end
local score = redis.call('ZSCORE', members_key, successor)
if not score or tonumber(score) <= now then return -1 end
if priority_of(redis.call('HGET', priorities_key, successor)) <= 0 then return -2 end
redis.call('DEL', lease_key)
redis.call('HSET', seat_key, 'successor', successor, 'until', now + window_ms)
redis.call('HDEL', seat_key, 'vacant')
redis.call('PUBLISH', wake_channel, 'handover ' .. successor)
return 1
