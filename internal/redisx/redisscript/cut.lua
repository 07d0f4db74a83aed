-- cut: the tombstones of acquires cut short, prepended to acquire.lua and
-- acquireshared.lua (with issue.lua, which calls split) and to forsake.lua
-- and forsakeshared.lua (which call bury); see redisscript.go.
--
-- An acquire whose caller gave up before its reply came (a deadline, a
-- cancellation, a network error) may still be on its way to the server: in
-- a socket's buffers, retransmitted by TCP, held by a proxy, or resent by
-- go-redis. Its clean-up (forsake.lua, forsakeshared.lua) goes on another
-- connection, so nothing orders the two: a clean-up that comes first finds
-- nothing to delete, and the acquire then takes the lock for its whole TTL
-- with nobody to hold it. So the clean-up also leaves a tombstone of the
-- grant's ownership part (the last OwnerLen = 32 hex digits of its value,
-- unique per grant) in the key's fencing counter, and a grant whose value
-- has a tombstone there is refused (issue.lua): whichever comes first, the
-- acquire and its clean-up leave nothing behind.
--
-- The counter is read and written by every grant anyway (issue.lua), so
-- the tombstones cost the grants of other keys nothing, and the grants of
-- this key a few string operations while one is in force. A counter with
-- tombstones is its number (a decimal, or nothing when the counter did not
-- exist) followed by '!' expiry ':' ownership part for each, expiry in
-- server milliseconds; a tombstone is in force until then. At most
-- maxCuts are kept (the oldest go first).

local maxCuts = 64

-- split reads a counter value c (a string) at ms (server milliseconds) and
-- returns its number (a decimal string, '' for none, or c whole if it is
-- not a counter with tombstones), its tombstones still in force, joined
-- ('' for none), how many, and the latest of their expiries (0 for none).
local function split(c, ms)
	local n, rest = string.match(c, '^(%d*)(!.*)$')
	if not n then
		return c, '', 0, 0
	end
	local keep, last = {}, 0
	for e, o in string.gmatch(rest, '!(%d+):(%x+)') do
		local x = tonumber(e)
		if x > ms then
			keep[#keep + 1] = '!' .. e .. ':' .. o
			if x > last then
				last = x
			end
		end
	end
	return n, table.concat(keep), #keep, last
end

-- buried reports whether the tombstones cuts (as split returns them) hold
-- the ownership part of value v.
local function buried(cuts, v)
	return cuts ~= '' and string.find(cuts, ':' .. string.sub(v, -32), 1, true) ~= nil
end

-- bury leaves a tombstone of value v, in force for window ms from ms, in
-- the fencing counter ctr, keeping its number and TTL (which it extends
-- to the window if shorter). A counter that is not a number (put there by
-- something else: every grant fails on it) is left alone.
local function bury(ctr, v, ms, window)
	local e = string.format('%.0f', ms + window)
	local mark = '!' .. e .. ':' .. string.sub(v, -32)
	local c = redis.call('GET', ctr)
	if not c then
		redis.call('SET', ctr, mark, 'PX', window)
		return
	end
	local n, cuts, k = split(c, ms)
	if n ~= '' and not string.find(n, '^%d+$') then
		return
	end
	while k >= maxCuts do
		cuts = string.gsub(cuts, '^![^!]*', '', 1)
		k = k - 1
	end
	redis.call('SET', ctr, n .. cuts .. mark, 'KEEPTTL')
	local p = redis.call('PTTL', ctr)
	if p >= 0 and p < window then
		redis.call('PEXPIRE', ctr, window)
	end
end
