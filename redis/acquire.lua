-- acquire: take the lock if it is free and issue a fencing token.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the fencing counter key (same hash slot as KEYS[1], no TTL)
-- ARGV[1]: the ownership value, unique per grant
-- ARGV[2]: the TTL in whole milliseconds
--
-- Returns the fencing token (an integer > 0) when the lock was taken, or a
-- one-element array {pttl} with the remaining lifetime of the current
-- holder's lease in milliseconds (-1: the key has no expiry) when it is held.
--
-- token = max(counter + 1, server time in microseconds), stored back in the
-- counter key. TIME is allowed before writes because scripts replicate their
-- effects (the default since Redis 5, the only mode since Redis 7).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	local t = redis.call('TIME')
	local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
	local token = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
	if now > token then
		token = now
	end
	-- %.0f keeps every digit (tostring would switch to exponent notation).
	redis.call('SET', KEYS[2], string.format('%.0f', token))
	return token
end
return {redis.call('PTTL', KEYS[1])}
