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
--          for a grant whose token is the server clock; without it (or
--          with '') the counter never expires
-- ARGV[5]: optional (the single-Redis backend, for the attempts of a
--          waiting Acquire): Request.Wait in whole milliseconds; an attempt
--          that finds the key held by shared leases keeps new shared
--          leases out for that long (see below)
--
-- Returns the token (> 0, as a decimal string: a Lua number, a double, is
-- not exact beyond 2^53) when the lock is ours, or with ARGV[3] 'clock' the
-- pair {token, clock}: the server time in microseconds read in this run,
-- which the lock key's expiry follows ('0' when this run is a retry, below,
-- and the grant's clock is not known); when it is held by someone else, it
-- marks the lock as waited for (see below) and returns -2 - PTTL, i.e. -1
-- for a key without expiry (PTTL -1) and -2 - ms otherwise (so 0 is never
-- returned; ms is at least 1, and for a key held by shared leases the time
-- until the last of them expires); -1 too when the grant is refused for a
-- tombstone (below).
--
-- The token is issued by issue (issue.lua, prepended to this script): the
-- larger of the counter + 1 and the server time in microseconds, written
-- back to the counter. SET with both NX and GET needs Redis 7.0.
--
-- Shared leases (the single-Redis backend; see acquireshared.lua and
-- shared.lua): while a key is held by shared leases, its lock key holds a
-- value that begins with a NUL byte, which no grant's value does (a
-- holder description is printable), so the SET NX below fails for an
-- exclusive request without a command more on its way to a grant. A
-- failed attempt that passes ARGV[5] (a writer that waits) writes into
-- that value the time until which new shared leases stay out, and makes
-- the lock key live until then at least: the writer is not starved by a
-- stream of readers, whether they release or expire. A lock key with no
-- valid shared holder left but a writer's time to come (the readers
-- expired), and one reserved for writers (a value NUL 'w' ..., left by the
-- last release while a writer waits), is a reservation: any exclusive
-- request takes it, as it takes a free key, keeping the waited-for mark.
-- The reply of a request refused by shared holders bounds the wait by the
-- expiry of the last of them (when the key can be a writer's), not by the
-- lock key's PTTL.
--
-- Tombstones (cut.lua, prepended with issue.lua): a grant whose value has a
-- tombstone in the counter (its acquire was given up and cleaned up before
-- it arrived) is not made: the script puts back what it took (a free key,
-- or the reservation) and returns -1.
local old = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
-- reserved: the reservation taken (its value and PTTL), put back if the
-- grant is refused; top, ms: the expiry of the last valid shared holder
-- and the server clock, in milliseconds, when shared holders hold.
local reserved, top, ms
if old and string.byte(old, 1) == 0 then
	local kind = string.byte(old, 2)
	if kind == 115 then
		-- NUL 's': shared holders, or none left valid (a reservation).
		-- The holders' key is spelled as shared.lua spells it (the lock
		-- key's slot).
		local t = redis.call('TIME')
		ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
		local z = KEYS[1] .. ':holders'
		local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
		if last[2] and tonumber(last[2]) > ms then
			top = tonumber(last[2])
		else
			redis.call('DEL', z, KEYS[1] .. ':tokens')
			kind = 119
		end
	end
	if kind == 119 then
		-- Reserved for writers, with no holder: ours, marked if the
		-- reservation was (its waiters must hear our release).
		reserved = {old, math.max(redis.call('PTTL', KEYS[1]), 1)}
		local v = ARGV[1]
		if string.byte(old, -1) == 43 then
			v = v .. '+'
		end
		redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
		old = false
	end
end
if not old then
	-- The key was free and is ours now.
	-- TIME gives seconds and microseconds as decimal strings; their
	-- concatenation (microseconds zero-padded to 6 digits) is the time in
	-- microseconds, written without a float-to-string conversion (Lua
	-- prints large numbers in exponent form).
	local t = redis.call('TIME')
	local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
	local token = issue(KEYS[2], now, ARGV[4], ARGV[1])
	if not token then
		-- Given up by its caller and cleaned up (a tombstone): not ours.
		if reserved then
			redis.call('SET', KEYS[1], reserved[1], 'PX', reserved[2])
		else
			redis.call('DEL', KEYS[1])
		end
		return -1
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
	-- The token is the counter's number (tombstones follow it, cut.lua).
	token = string.match(token, '^%d+') or token
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
if top then
	-- Held by shared leases (NUL 's' permits ':' until, see shared.lua):
	-- a waiting writer keeps new shared leases out until ms + ARGV[5] (if
	-- that is later than what the value says), keeping the mark; the lock
	-- key lives until then at least, past the holders if they expire.
	if ARGV[5] then
		local p, w = string.match(string.sub(old, 2), '^s(%d+):(%d+)')
		local u = ms + tonumber(ARGV[5])
		if p and u > tonumber(w) then
			redis.call('SET', KEYS[1], string.char(0) .. 's' .. p .. ':' .. string.format('%.0f', u) .. '+',
				'PXAT', string.format('%.0f', math.max(u, top)))
		end
	end
	-- The key can be a writer's once the last holder has gone.
	return -2 - (top - ms)
end
-- A key about to expire has a PTTL of 0: 1 ms then, so that a waiter tries
-- again right after it (and marks what holds the key then), not after its
-- fallback poll.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == 0 then
	pttl = 1
end
return -2 - pttl
