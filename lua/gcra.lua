-- GCRA (generic cell rate algorithm): a token bucket kept as its theoretical
-- arrival time (TAT). The interval is a binary fixed point number (see
-- src/core/limiter.h): ticks of 2^-k microseconds, fine enough that the admitted
-- rate is off by less than 1e-6 relative at any rate.
--   a = emission interval T (ticks), b = tau + k: burst tolerance tau = burst
--       x T (ticks) and the tick exponent k = b mod T (0 <= k <= 40 < T)
-- The key holds "<tat>:<frac>": the TAT in whole microseconds of Redis time
-- and what it has beyond, in ticks; ":<frac>" is left out when 0, so a value
-- written by an earlier version (the TAT alone, T in whole microseconds) reads
-- the same. A fraction from another k (the rate changed) is clamped into one
-- microsecond; a value that does not parse is an empty bucket.
--
-- Everything is computed relative to now, in ticks, and stays below 2^53
-- (exact in doubles): what the bucket owes d <= DEBT_MAX = 2^51, a cost is
-- clamped to +-(floor(DEBT_MAX / T) + 1) tokens so |cost x T| < 2^52 (a
-- refund that large empties any debt), and the TAT written, now + floor(d /
-- 2^k), stays below 2^53 while now < 2^52 us (until the year 2112). The debt
-- is capped at DEBT_MAX: a report of more than fits owes at most that (at
-- least two whole buckets, as tau <= 2^50).
--
-- State for the commit: s1 = the debt after the charge (ticks), s2 = 2^k.
-- The quantities here are finite and >= 0: x - x % 1 is floor(x) and
-- x + (-x) % 1 is ceil(x), exactly (Lua's % is x - floor(x), exact in
-- doubles), without a function call. One tick is 2^-k us, so a division by
-- 2^k is exact.
local function gcra_check(v, now, cost, T, b, at)
	local DEBT_MAX = 2 ^ 51
	local k = b % T
	local tau = b - k
	local one = 2 ^ k
	local d = 0
	if v then
		local tu, tf, e = string.match(v, '^(%d+):?(%d*)()', at or 1)
		if tu and (string.byte(v, e) or 124) == 124 then
			tu = tu + 0 -- digits: converted as tonumber() would
			if tu >= now then
				if tu - now > DEBT_MAX / one then
					d = DEBT_MAX
				else
					if tf == '' then tf = 0 else tf = tf + 0 end
					if tf >= one then tf = one - 1 end
					d = (tu - now) * one + tf
					if d > DEBT_MAX then d = DEBT_MAX end
				end
			end
		end
	end
	local cmax = DEBT_MAX / T
	cmax = cmax - cmax % 1 + 1
	local c = cost
	if c > cmax then c = cmax elseif c < -cmax then c = -cmax end
	local nd = d + c * T
	if nd < 0 then nd = 0 end -- a refund never goes past full
	if nd > DEBT_MAX then nd = DEBT_MAX end
	local rem_u = 0
	if tau > d then
		rem_u = (tau - d) / T
		rem_u = rem_u - rem_u % 1
	end
	local reset_c, reset_u = nd / one, d / one
	reset_c, reset_u = reset_c + (-reset_c) % 1, reset_u + (-reset_u) % 1
	if nd <= tau then
		local rem_c = (tau - nd) / T
		return 1, rem_c - rem_c % 1, rem_u, 0, reset_c, reset_u, nd, one
	end
	local retry = (nd - tau) / one
	return 0, 0, rem_u, retry + (-retry) % 1, reset_c, reset_u, nd, one
end

local function gcra_commit(now, cost, T, b, nd, one)
	local whole = nd / one
	whole = whole - whole % 1
	local frac = nd - whole * one
	local ttl = nd / one
	ttl = (ttl + (-ttl) % 1) / 1000
	ttl = ttl + (-ttl) % 1
	if ttl < 1 then ttl = 1 end
	if frac > 0 then
		return string.format('%d:%d', now + whole, frac), ttl
	end
	return string.format('%d', now + whole), ttl
end
