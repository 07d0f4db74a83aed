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
-- ARGV[1]: the most bytes to read of the lock value and of the counter
--
-- Returns {-2} for a missing lock key; else {PTTL, the lock value's first
-- ARGV[1] bytes, its length, the counter's first ARGV[1] bytes ('' when
-- missing)} and, when the lock value begins with a NUL byte (shared
-- holders or a reservation), also the server clock (TIME's seconds and
-- microseconds), the holders with their scores (ZRANGE WITHSCORES, flat)
-- and the tokens (HGETALL, flat).
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
out[7] = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
out[8] = redis.call('HGETALL', KEYS[4])
return out
