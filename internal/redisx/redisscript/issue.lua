-- issue: prepended to acquire.lua and acquireshared.lua (see
-- redisscript.go), which call it; it calls split and buried (cut.lua,
-- prepended before it).
--
-- issue(ctr, now, ttl, v) issues the fencing token of a grant of value v
-- and returns it (a decimal string: a Lua number, a double, is not exact
-- beyond 2^53), or false when the counter holds a tombstone of v (cut.lua:
-- the grant's acquire was given up by its caller, and cleaned up before it
-- arrived): the grant must not be made, and the caller undoes what it
-- wrote for it (the counter is as it was, less expired tombstones). ctr is
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
--
-- Tombstones (cut.lua) follow the counter's number in its value, so the
-- common case above never meets them: a counter with tombstones is not a
-- number. They are then kept (those still in force) after the token
-- written back, and the counter's TTL covers them.
local function issue(ctr, now, ttl, v)
	-- Write the clock and read the counter in one command (the common
	-- case: the counter is behind the clock, or gone).
	local c
	local expires = ttl and ttl ~= ''
	if expires then
		c = redis.call('SET', ctr, now, 'PX', ttl, 'GET')
	else
		c = redis.call('SET', ctr, now, 'GET')
	end
	if not c or (tonumber(c) and tonumber(c) < tonumber(now)) then
		return now
	end
	local ms = tonumber(string.sub(now, 1, -4))
	local n, cuts, _, last = split(c, ms)
	-- behind: the counter's number is below the clock (or there is none),
	-- so the clock is the token and the counter may expire.
	local behind = n == '' or (tonumber(n) and tonumber(n) < tonumber(now))
	-- keep writes the counter's value x back with the tombstones: with
	-- the TTL set above when it may expire (long enough for them), else
	-- without expiry.
	local function keep(x)
		if behind then
			redis.call('SET', ctr, x .. cuts, 'KEEPTTL')
			if expires and cuts ~= '' and ms + tonumber(ttl) < last then
				redis.call('PEXPIREAT', ctr, string.format('%.0f', last))
			end
		else
			redis.call('SET', ctr, x .. cuts)
		end
	end
	if buried(cuts, v) then
		keep(n)
		return false
	end
	if behind then
		keep(now)
		return now
	end
	-- The counter was at or ahead of the clock (or not a number, which
	-- INCR reports): put it back, without expiry, and issue counter + 1,
	-- exact integer arithmetic in Redis; read back as a string, since
	-- INCR's reply reaches Lua as a double. (The comparison above is exact
	-- where it matters: the clock is below 2^53, and a counter beyond 2^53
	-- is far above it.)
	redis.call('SET', ctr, n)
	redis.call('INCR', ctr)
	local token = redis.call('GET', ctr)
	if cuts ~= '' then
		redis.call('APPEND', ctr, cuts)
	end
	return token
end
