-- GCRA (generic cell rate algorithm): a token bucket kept as its theoretical
-- arrival time (TAT). The interval is a binary fixed point number (see
-- src/limiter.h): ticks of 2^-k microseconds, fine enough that the admitted
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
local GCRA_DEBT_MAX = 2 ^ 51
ALG[1] = function(key, now, cost, T, b)
	local k = b % T
	local tau = b - k
	local one = 2 ^ k
	local d = 0
	local v = redis.call('GET', key)
	if v then
		local tu, tf = string.match(v, '^(%d+):?(%d*)$')
		tu = tonumber(tu)
		if tu and tu >= now then
			if tu - now > math.floor(GCRA_DEBT_MAX / one) then
				d = GCRA_DEBT_MAX
			else
				tf = tonumber(tf) or 0
				if tf >= one then tf = one - 1 end
				d = (tu - now) * one + tf
				if d > GCRA_DEBT_MAX then d = GCRA_DEBT_MAX end
			end
		end
	end
	local cmax = math.floor(GCRA_DEBT_MAX / T) + 1
	local c = cost
	if c > cmax then c = cmax elseif c < -cmax then c = -cmax end
	local nd = d + c * T
	if nd < 0 then nd = 0 end -- a refund never goes past full
	if nd > GCRA_DEBT_MAX then nd = GCRA_DEBT_MAX end
	local r = {}
	r.ok = (nd <= tau) and 1 or 0
	r.rem_c = math.floor(clamp0(tau - nd) / T)
	r.rem_u = math.floor(clamp0(tau - d) / T)
	r.retry = (r.ok == 1) and 0 or math.ceil((nd - tau) / one)
	r.reset_c = math.ceil(nd / one)
	r.reset_u = math.ceil(d / one)
	r.commit = function()
		local whole = math.floor(nd / one)
		local frac = nd - whole * one
		local ttl = math.ceil(r.reset_c / 1000)
		if ttl < 1 then ttl = 1 end
		if frac > 0 then
			v = string.format('%d:%d', now + whole, frac)
		else
			v = string.format('%d', now + whole)
		end
		redis.call('SET', key, v, 'PX', ttl)
	end
	return r
end
