-- acquire: take the lock if it is free, and issue a fencing token.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the fencing counter key (same hash slot as KEYS[1])
-- ARGV[1]: the lock value, unique per grant: the holder description, then
--          32 hex digits (NewValue in value.go); compared whole, and never
--          ending with '+' (the mark, below)
-- ARGV[2]: the TTL in whole milliseconds
-- ARGV[3]: optional; 'clock' makes a grant's reply carry the server clock
--          too (Redlock, see below); any other value (the single-Redis
--          backend passes '') does not
-- ARGV[4]: optional; the counter's TTL in whole milliseconds (> ARGV[2])
--          for a grant whose token is the server clock; without it the
--          counter never expires
--
-- Returns the token (> 0, as a decimal string: a Lua number, a double, is
-- not exact beyond 2^53) when the lock is ours, or with ARGV[3] 'clock' the
-- pair {token, clock}: the server time in microseconds read in this run,
-- which the lock key's expiry follows ('0' when this run is a retry, below,
-- and the grant's clock is not known); when it is held by someone else, it
-- marks the lock as waited for (see below) and returns -2 - PTTL, i.e. -1
-- for a key without expiry (PTTL -1) and -2 - ms otherwise (so 0 is never
-- returned).
--
-- The token is the larger of the counter + 1 and the server time in
-- microseconds, and it is written back to the counter: a clock floor under
-- every grant. The counter alone could repeat tokens: a counter lost or
-- restored stale (a restart from an RDB snapshot or an AOF fsynced every
-- second, a failover to a replica that missed the last increments, an
-- eviction, a DEL) would hand out earlier tokens again, while the lock
-- keys taken since are lost with it. With the floor, a token is below an
-- earlier one only if this server's clock reads behind that token (see
-- doc.go of the redis package). TIME before a write is allowed because
-- scripts replicate their effects (the only mode since Redis 7). SET with
-- both NX and GET needs Redis 7.0.
--
-- The counter is bounded: when the token is the clock, every later token
-- is the clock or more, so the counter is needed only to survive a clock
-- that steps back; with ARGV[4] it then expires ARGV[4] ms after the grant
-- (the lock's TTL plus a retention). When the token comes from the counter
-- (the counter is at or ahead of the clock), the counter is kept without
-- expiry: until the clock passes it, it alone orders the tokens; the next
-- grant whose token is the clock sets its expiry again.
local old = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not old then
	-- The key was free and is ours now.
	-- TIME gives seconds and microseconds as decimal strings; their
	-- concatenation (microseconds zero-padded to 6 digits) is the time in
	-- microseconds, written without a float-to-string conversion (Lua
	-- prints large numbers in exponent form).
	local t = redis.call('TIME')
	local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
	-- Write the clock and read the counter in one command (the common
	-- case: the counter is behind the clock, or gone).
	local c
	if ARGV[4] then
		c = redis.call('SET', KEYS[2], now, 'PX', ARGV[4], 'GET')
	else
		c = redis.call('SET', KEYS[2], now, 'GET')
	end
	local token = now
	if c and not (tonumber(c) and tonumber(c) < tonumber(now)) then
		-- The counter was at or ahead of the clock (or not a number,
		-- which INCR reports): put it back, without expiry, and issue
		-- counter + 1, exact integer arithmetic in Redis; read back as a
		-- string, since INCR's reply reaches Lua as a double. (The
		-- comparison above is exact where it matters: the clock is below
		-- 2^53, and a counter beyond 2^53 is far above it.)
		redis.call('SET', KEYS[2], c)
		redis.call('INCR', KEYS[2])
		token = redis.call('GET', KEYS[2])
	end
	if ARGV[3] == 'clock' then
		return {token, now}
	end
	return token
end
local last = string.byte(old, -1)
if old == ARGV[1] or (last == 43 and old == ARGV[1] .. '+') then
	-- A retry of this very acquire whose first reply was lost (go-redis
	-- resends on network errors, a pipeline with WAIT after a read
	-- timeout): the lock is ours, and the counter still holds the token the
	-- first run issued (with ARGV[4], it expires after the lock's first
	-- TTL, which has not passed: the lock is still here).
	local token = redis.call('GET', KEYS[2])
	if not token then
		return redis.error_reply('dlock: the fencing counter vanished while the lock was held')
	end
	-- Write the counter again (same value, same expiry): a replicated
	-- write, so that a WAIT after this script on this connection waits
	-- until the replicas have everything up to now, the first run's lock
	-- key included. Without it, a resent acquire + WAIT pipeline would
	-- write nothing on its new connection, and WAIT would count the
	-- replicas at once.
	redis.call('SET', KEYS[2], token, 'KEEPTTL')
	if ARGV[3] == 'clock' then
		return {token, '0'}
	end
	return token
end
-- Held by someone else: mark the lock as waited for (append '+' to the
-- holder's value, once), so that its release is published (release.lua).
-- APPEND keeps the key's TTL.
if last ~= 43 then
	redis.call('APPEND', KEYS[1], '+')
end
return -2 - redis.call('PTTL', KEYS[1])
