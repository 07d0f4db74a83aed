-- issue: prepended to acquire.lua and acquireshared.lua (see
-- redisscript.go), which call it.
--
-- issue(ctr, now, ttl) issues a grant's fencing token and returns it (a
-- decimal string: a Lua number, a double, is not exact beyond 2^53). ctr is
-- the fencing counter key, now the server time in microseconds (a decimal
-- string, from TIME), ttl the counter's TTL in whole milliseconds, or
-- false or '' for a counter that never expires.
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
-- scripts replicate their effects (the only mode since Redis 7).
--
-- The counter is bounded: when the token is the clock, every later token
-- is the clock or more, so the counter is needed only to survive a clock
-- that steps back; with ttl it then expires ttl ms after the grant (the
-- lock's TTL plus a retention). When the token comes from the counter
-- (the counter is at or ahead of the clock), the counter is kept without
-- expiry: until the clock passes it, it alone orders the tokens; the next
-- grant whose token is the clock sets its expiry again.
local function issue(ctr, now, ttl)
	-- Write the clock and read the counter in one command (the common
	-- case: the counter is behind the clock, or gone).
	local c
	if ttl and ttl ~= '' then
		c = redis.call('SET', ctr, now, 'PX', ttl, 'GET')
	else
		c = redis.call('SET', ctr, now, 'GET')
	end
	if c and not (tonumber(c) and tonumber(c) < tonumber(now)) then
		-- The counter was at or ahead of the clock (or not a number,
		-- which INCR reports): put it back, without expiry, and issue
		-- counter + 1, exact integer arithmetic in Redis; read back as a
		-- string, since INCR's reply reaches Lua as a double. (The
		-- comparison above is exact where it matters: the clock is below
		-- 2^53, and a counter beyond 2^53 is far above it.)
		redis.call('SET', ctr, c)
		redis.call('INCR', ctr)
		return redis.call('GET', ctr)
	end
	return now
end
