-- inspect: read what Inspect reports of one lock of the single-Redis
-- backend, writing nothing (InspectShared in inspect.go). A script rather
-- than MULTI/EXEC: it reads the same in one round trip, atomically, and
-- needs no right beyond those of the lock scripts and the read commands it
-- calls (see the redis package documentation, Permissions).
--
-- KEYS[1]: the lock key
-- KEYS[2]: its fencing counter key (same hash slot)
-- KEYS[3]: its holders (sorted set; same slot; see shared.lua)
-- KEYS[4]: its holders' tokens (hash; same slot)
-- ARGV[1]: the most bytes to read of the lock value and of the counter,
--          and of each holder's value and token
-- ARGV[2]: the most holders to read
--
-- Returns {-2} for a missing lock key; else {PTTL, the lock value's first
-- ARGV[1] bytes, its length, the counter's first ARGV[1] bytes ('' when
-- missing)} and, when the lock value begins with a NUL byte (shared
-- holders or a reservation), also the server clock (TIME's seconds and
-- microseconds), the first ARGV[2] holders with their scores (ZRANGE
-- WITHSCORES, flat; each value cut to ARGV[1] bytes) and their tokens (one
-- HGET each, cut to ARGV[1] bytes; '' when missing), in the same order.
-- Nothing is returned whole that anyone but dlock could have made large:
-- the reply is bounded by ARGV[1] and ARGV[2].
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
	return {-2}
end
local bound = tonumber(ARGV[1])
local v = redis.call('GETRANGE', KEYS[1], 0, bound - 1)
local out = {pttl, v, redis.call('STRLEN', KEYS[1]), redis.call('GETRANGE', KEYS[2], 0, bound - 1)}
if string.byte(v, 1) ~= 0 then
	return out
end
local t = redis.call('TIME')
out[5], out[6] = t[1], t[2]
local most = tonumber(ARGV[2])
local members = redis.call('ZRANGE', KEYS[3], 0, most - 1, 'WITHSCORES')
local tokens = {}
for i = 1, #members, 2 do
	tokens[#tokens + 1] = string.sub(redis.call('HGET', KEYS[4], members[i]) or '', 1, bound)
	members[i] = string.sub(members[i], 1, bound)
end
out[7] = members
out[8] = tokens
return out
