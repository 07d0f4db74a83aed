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
-- token = max(last token + 1, server time in microseconds); the token is
-- stored in the counter key. TIME before writes is allowed because scripts
-- replicate their effects (the default since Redis 5, the only mode since
-- Redis 7). SET ... GET needs Redis 6.2.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	local t = redis.call('TIME')
	-- TIME gives seconds and microseconds as decimal strings; their
	-- concatenation (microseconds zero-padded to 6 digits) is the time in
	-- microseconds, written without a float-to-string conversion (which
	-- would lose digits before Redis 7).
	local us = t[2]
	local now = t[1] .. string.rep('0', 6 - #us) .. us
	local last = tonumber(redis.call('SET', KEYS[2], now, 'GET'))
	local token = tonumber(now)
	if last and last >= token then
		-- The counter is ahead of this server's clock: several grants in
		-- one microsecond, or tokens from a server with a faster clock.
		token = last + 1
		redis.call('SET', KEYS[2], string.format('%.0f', token))
	end
	return token
end
return {redis.call('PTTL', KEYS[1])}
