-- shared: prepended to the shared-lease scripts of the single-Redis
-- backend (acquireshared.lua, releaseshared.lua, refreshshared.lua,
-- refreshmanyshared.lua; see redisscript.go), which call it.
--
-- A key held by shared leases (semaphore permits, or readers of a
-- read-write lock) has, all in the lock key's hash slot:
--   - the lock key, whose value is NUL 's' permits ':' until, and '+'
--     when a waiter has marked it (as acquire.lua marks an exclusive
--     holder's value): permits is the semaphore's size (0 for readers);
--     until is the server time in milliseconds before which new shared
--     leases stay out, because a writer waits (0: none; acquire.lua
--     writes it). The value begins with a NUL byte, which no grant's value
--     does, so an exclusive SET NX fails on it, and it expires with the
--     last holder (PEXPIREAT the highest score below), or at until if that
--     is later: a waiting writer's time outlives holders that expire.
--     While no holder is valid and until is to come, the key is a
--     reservation for writers, as NUL 'w' below.
--   - the holders, a sorted set (lock key .. ':holders'): one member per
--     lease, its value (the holder description and the ownership part, as
--     an exclusive lock's value), scored by its expiry in server
--     milliseconds (TIME). A lease is valid while the server clock reads
--     before its score; expired members are pruned by the scripts.
--   - the tokens, a hash (lock key .. ':tokens'): each member's fencing
--     token, for Inspect and for a resent acquire.
-- When the last holder leaves while a writer waits, the lock key becomes
-- NUL 'w' until (and the mark), a reservation that expires at until and
-- that any exclusive acquire takes (acquire.lua), while shared ones wait.
-- The holders' key is spelled out in acquire.lua too.

-- clock returns the server time in whole milliseconds (a Lua number,
-- exact: far below 2^53) and in microseconds (a decimal string, for
-- issue).
local function clock()
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- ms formats a whole number of milliseconds as an integer (Lua's own
-- tostring would switch to exponent form past 14 digits).
local function ms(n)
	return string.format('%.0f', n)
end

-- parse reads a lock value v (false for a missing key) and returns its
-- kind: 's' (shared holders) with the permits (a decimal string, compared
-- as such: exact for any size), the until and whether it is marked; 'w' (a
-- reservation for writers) with '0', the until and the mark; or nil for a free key, an exclusive holder's value and any other
-- value (planted by something else: treated as an exclusive holder).
local function parse(v)
	if not v or string.byte(v, 1) ~= 0 then
		return nil
	end
	local marked = string.byte(v, -1) == 43
	local body = string.sub(v, 2)
	local p, w = string.match(body, '^s(%d+):(%d+)%+?$')
	if p then
		return 's', p, tonumber(w), marked
	end
	w = string.match(body, '^w(%d+)%+?$')
	if w then
		return 'w', '0', tonumber(w), marked
	end
	return nil
end

-- sentinel is the lock value of shared holders (see above); permits is
-- a decimal string.
local function sentinel(permits, w, marked)
	local v = string.char(0) .. 's' .. permits .. ':' .. ms(w)
	if marked then
		v = v .. '+'
	end
	return v
end

-- prune removes the holders of z (and their tokens in h) whose lease has
-- run out by now, a few hundred at a time (unpack's bound), and returns
-- how many holders are left.
local function prune(z, h, now)
	while true do
		local gone = redis.call('ZRANGE', z, '-inf', ms(now), 'BYSCORE', 'LIMIT', 0, 500)
		if #gone == 0 then
			break
		end
		redis.call('ZREM', z, unpack(gone))
		redis.call('HDEL', h, unpack(gone))
		if #gone < 500 then
			break
		end
	end
	return redis.call('ZCARD', z)
end

-- expire makes z and h expire with the last holder of z (which has one),
-- at its score, in server milliseconds, so that neither outlives the
-- holders, and the lock key lk (which exclusive requests see) then too,
-- or at w (the writer's time of its value, a number) if that is later: a
-- waiting writer's reservation outlives the holders it waited for.
local function expire(lk, z, h, w)
	local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
	redis.call('PEXPIREAT', lk, ms(math.max(tonumber(last[2]), w)))
	redis.call('PEXPIREAT', z, last[2])
	redis.call('PEXPIREAT', h, last[2])
end

-- earliest returns how long, in ms, until the first holder of z (which
-- has one) expires: when a permit frees at the latest.
local function earliest(z, now)
	local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
	return math.max(tonumber(first[2]) - now, 1)
end

-- vacate ends the shared holding of lk once no holder is left: z and h
-- are deleted, and so is lk, unless a writer waits (w is later than now):
-- lk then becomes a reservation for writers until w, keeping the mark.
local function vacate(lk, z, h, now, w, marked)
	redis.call('DEL', z, h)
	if w > now then
		local v = string.char(0) .. 'w' .. ms(w)
		if marked then
			v = v .. '+'
		end
		redis.call('SET', lk, v, 'PXAT', ms(w))
	else
		redis.call('DEL', lk)
	end
end

-- refresh extends the shared lease v on lk (holders z, tokens h) to ttl
-- ms from now if it is still valid, and reports 1, or 0 when it is not
-- (released, expired, or the lock key is not held by shared leases any
-- more: a lease is never re-created).
local function refresh(lk, z, h, v, ttl, now)
	local kind, _, w = parse(redis.call('GET', lk))
	if kind ~= 's' then
		return 0
	end
	local s = redis.call('ZSCORE', z, v)
	if not s or tonumber(s) <= now then
		return 0
	end
	redis.call('ZADD', z, 'XX', ms(now + tonumber(ttl)), v)
	prune(z, h, now)
	expire(lk, z, h, w)
	return 1
end

-- release ends the shared lease v on lk (holders z, tokens h) if it is
-- still valid at now, and wakes the waiters if a waiter has marked lk:
-- releaseshared.lua's reply (see there), which it is.
local function release(lk, z, h, v, now)
	local kind, _, w, marked = parse(redis.call('GET', lk))
	if kind ~= 's' then
		return 0
	end
	local s = redis.call('ZSCORE', z, v)
	if not s or tonumber(s) <= now then
		return 0
	end
	redis.call('ZREM', z, v)
	redis.call('HDEL', h, v)
	if prune(z, h, now) > 0 then
		expire(lk, z, h, w)
	else
		vacate(lk, z, h, now, w, marked)
	end
	if marked then
		local r = redis.pcall('PUBLISH', lk .. ':released', '1')
		if type(r) == 'table' and r.err then
			return 2
		end
	end
	return 1
end
