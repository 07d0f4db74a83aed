-- below: prepended to raise.lua, release.lua and refresh.lua (see
-- redisscript.go), which call it.
--
-- below(c, v) reports whether counter value c (a string, or false for a
-- missing key) is below v, a decimal integer without leading zeros. The
-- comparison is exact, on the decimal strings: Lua numbers are doubles,
-- which cannot tell neighbouring integers apart beyond 2^53. A counter that
-- is not canonical (leading zeros, a sign) is compared as a number; one
-- that is not a number at all is not below anything (acquire.lua reports
-- it).
local function below(c, v)
	if not c then
		return true
	end
	if not string.find(c, '^[1-9]%d*$') then
		local n = tonumber(c)
		return n ~= nil and n < tonumber(v)
	end
	if #c ~= #v then
		return #c < #v
	end
	return c < v
end
