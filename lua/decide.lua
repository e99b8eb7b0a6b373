-- The driver: several limits of one principal, checked and charged
-- atomically (Redis runs a script whole). Time comes from Redis TIME, so every
-- gateway shares one clock.
--
-- One decision a call (the single form):
--
-- KEYS[i]          state of limit i; all keys of one call share a hash tag
-- ARGV[5(i-1)+1]   algorithm of limit i: 1 gcra, 2 fixed window, 3 sliding
--                  log, 4 sliding window counter, 5 fixed window on calendar
--                  months, 6 concurrency (its cost is a slot: see its file)
-- ARGV[5(i-1)+2]   parameter a of the algorithm (see its file), an integer >= 1
-- ARGV[5(i-1)+3]   parameter b of the algorithm, an integer >= 0 (both below
--                  2^53, and a GCRA's as src/core/limiter.h bounds them)
-- ARGV[5(i-1)+4]   flags: 1 = shadow (evaluated and reported, never denies)
-- ARGV[5(i-1)+5]   cost of the request for limit i, in tokens: > 0 charges,
--                  0 only reports, < 0 refunds an earlier charge (always
--                  applied, never denies); an integer, clamped to +-2^50
--
-- Optional, after the limits (a batch: "units" of the request above):
-- ARGV[5n+1]       want: units asked for (1 to 2^50)
-- ARGV[5n+2]       mode: 0 = grant, up to <want> units, as many as every
--                  enforcing limit admits now, never more (a lease, or
--                  several coalesced requests); 1 = report, <want> units
--                  already admitted locally, charged whatever is left
-- ARGV[5n+3]       lease lifetime wanted (us); the answer shortens it so a
--                  lease never outlives the window of a windowed limit
-- ARGV[5n+4]       grant only: the fewest units worth a call (default 1), a
--                  lease. When fewer fit and a whole lease will fit within the
--                  lease lifetime, nothing is granted and the answer is a
--                  denial whose retry is when it fits (a hot key over its
--                  limit then costs one call per lease, not per request; the
--                  tokens wait in the bucket); when it would take longer (a
--                  window that ends later), what fits is granted
-- Arguments beyond 5n+4 are ignored, and so are one or two after the limits.
--
-- Without a batch, a request passes only if every enforcing limit admits it;
-- then every limit that admits it is charged (a shadow limit that would deny
-- is not). When it is denied nothing is charged.
--
-- Returns a flat array of integers:
--   { allowed, n, now_us, then per limit i: ok_i, remaining_i, retry_ms_i, reset_ms_i }
-- and with a batch two more: { ..., granted, lease_ms }: granted = units
-- charged (grant) or units that fitted (report; the rest were over the limit).
-- Bad arguments are an error reply, and nothing is written.
--
-- Several decisions a call (the multi form): D decisions, each exactly as
-- its own call of the single form, made in order at one Redis time (one TIME
-- and one script call for all: what a decision costs Redis drops by about a
-- quarter at D = 8, a third at D = 32; for one decision the single form is
-- the cheaper).
--
-- ARGV[1]          "M" (never an algorithm)
-- ARGV[2]          D, the number of decisions (0 or more)
-- then per decision j = 1..D, in order:
--   n_j            its number of limits (0 or more)
--   x_j            its number of arguments after the limits: 0 without a
--                  batch, 3 or 4 with one
--   5 n_j + x_j    its arguments exactly as in the single form
-- KEYS             the n_1 keys of decision 1, then the n_2 of decision 2...
--                  (in a cluster, every key of the call in one hash slot)
--
-- The compact form sends each distinct limit of the call once, and a
-- decision's limit as its index among them and its cost: 2 arguments a limit
-- instead of 5 (Redis makes an object of every argument and Lua interns every
-- string: per decision, the arguments are a large part of what the call
-- costs). A bad table of limits is one error reply, and no decision is made;
-- a bad index or cost is that decision's error.
-- ARGV[1]          "C"
-- ARGV[2]          D
-- ARGV[3]          U, the distinct limits
-- ARGV[4..3+4U]    each as "<alg> <a> <b> <flags>", as in the single form
-- then per decision j: n_j, x_j, then per limit "<index 1..U> <cost>", then
-- its x_j arguments after the limits (a batch's).
-- For example the two decisions above:
--   EVALSHA <sha> 2 <key1> <key2> C 2 1 1 <a> <b> 0  1 0 1 1  1 3 1 1 5 0 1000000
--
-- The cross-slot form, for a cluster: decisions whose keys live in several
-- hash slots of one master. Redis refuses a call whose declared keys span
-- slots (CROSSSLOT), but lets a script reach keys of other slots that this
-- node serves: the first decision's keys are declared (they route the call,
-- and a MOVED or ASK for their slot comes back as usual), the others are
-- arguments. A decision whose keys this node does not serve (a slot that
-- moved, or is moving) fails at its first read, before it writes anything:
-- its element is that error, and the agent sends it again alone.
-- ARGV[1]          "X"
-- ARGV[2]          D
-- ARGV[3]          K, the keys given as arguments
-- ARGV[4..3+K]     the keys of the decisions after those in KEYS, in order
-- then per decision as in the multi form. Its compact form "Q" has, after the
-- keys, the table of limits as in "C" (U, then 4 U arguments), then the
-- decisions as in "C".
-- For example two decisions, one GCRA limit each, the second a grant of up
-- to 5 units with a lease of 1 s:
--   EVALSHA <sha> 2 <key1> <key2> M 2  1 0 1 <a> <b> 0 1  1 3 1 <a> <b> 0 1 5 0 1000000
--
-- Returns an array of D elements, in the order of the decisions. Element j is
-- exactly the single form's reply to decision j made alone at that point:
-- its array of integers (now_us is the same in every one), or an error
-- element. An error element is the single form's error message: bad
-- arguments (nothing of that decision is written), or a Redis command of the
-- decision that failed (e.g. WRONGTYPE, OOM: what it wrote before stays, as
-- in a single call; the single form's error reply adds the script and line).
-- Either way the other decisions are made. A call whose counts do not add up
-- to its KEYS and ARGV is one error reply, and no decision is made.
-- Decisions may share keys: each sees what the ones before it wrote.
-- Redis serves nobody else during the call, which lasts as long as its
-- decisions together: bound D (a sliding log limit may take up to ~1 ms of a
-- decision, see sliding_log.lua).

-- The algorithms by id: ALG[2 id - 1] checks, ALG[2 id] commits. Those of a
-- sorted set (3, 6) read and write their key; the others are given their
-- state and return the new one (state.lua: ALG.read, ALG.write; ALG.flush
-- writes what a decision changed).
local ALG = { gcra_check, gcra_commit, fixed_window_check, fixed_window_commit,
	sliding_log_check, sliding_log_commit, sliding_window_check, sliding_window_commit,
	fixed_month_check, fixed_month_commit, concurrency_check, concurrency_commit,
	read = state_read, write = state_write, flush = state_flush }

-- Checks the <n> limits of <lim> (7 per limit: id, a, b, shadow, cost, and in
-- layout 2 the needle and fallback flag of state.lua; keys KEYS[kb + 1..kb + n],
-- states in <st>) at <now> for <units> units. Fills <res>, 9 per limit:
-- ok, rem_c, rem_u, retry, reset_c, reset_u, the cost checked and the
-- algorithm's state s1, s2. Returns 1 if every enforcing limit admits them,
-- else 0, and how long until they fit (us, 0 = now). Windows (fixed, sliding
-- counter) only make room when they reset, and what is left in the old one
-- would be lost: for them there is no waiting (math.huge).
local function check(ALG, st, res, lim, n, kb, now, units)
	local keys = KEYS
	local all, wait = 1, 0
	for i = 1, n do
		local o, r = 7 * i - 7, 9 * i - 9
		local id, cost = lim[o + 1], lim[o + 5]
		if units ~= 1 then
			cost = cost * units
			if cost > 2 ^ 50 then cost = 2 ^ 50 elseif cost < -2 ^ 50 then cost = -2 ^ 50 end
		end
		local key, at = keys[kb + i], nil
		if id ~= 3 and id ~= 6 then key, at = ALG.read(st, key, lim[o + 6], lim[o + 7]) end
		local ok, rc, ru, retry, sc, su, s1, s2 = ALG[2 * id - 1](key, now, cost, lim[o + 2],
			lim[o + 3], at)
		if cost < 0 then ok = 1; retry = 0 end
		if ok == 0 and not lim[o + 4] then
			all = 0
			if id == 2 or id == 4 then
				wait = math.huge
			elseif retry > wait then
				wait = retry
			end
		end
		res[r + 1], res[r + 2], res[r + 3], res[r + 4], res[r + 5] = ok, rc, ru, retry, sc
		res[r + 6], res[r + 7], res[r + 8], res[r + 9] = su, cost, s1, s2
	end
	return all, wait
end

-- The algorithm, parameters and flags of a limit, from ARGV[o + 1..o + 4],
-- checked: id, a, b, shadow, and in layout 2 the needle of its field
-- ("|<field>=") and whether to read layout 1 when it holds nothing
-- (state.lua); or nil and the error's text. <cache> (or nil)
-- holds the numbers already converted, by their text.
local function parse_limit(argv, o, cache)
	local tonumber = tonumber
	local s = argv[o + 1]
	local id
	if s == '1' then id = 1 elseif s == '2' then id = 2 elseif s == '3' then id = 3
	elseif s == '4' then id = 4 else id = tonumber(s) end
	if id ~= 1 and id ~= 2 and id ~= 3 and id ~= 4 and id ~= 5 and id ~= 6 then
		return nil, 'unknown algorithm ' .. tostring(s)
	end
	local sa, sb = argv[o + 2], argv[o + 3]
	local a, b
	if cache then
		a, b = cache[sa], cache[sb]
		if not a then a = tonumber(sa); if a then cache[sa] = a end end
		if not b then b = tonumber(sb); if b then cache[sb] = b end end
	else
		a, b = tonumber(sa), tonumber(sb)
	end
	-- integers only, below 2^53, and a bucket's interval and tolerance as
	-- src/core/limiter.h bounds them: nothing below may leave the exact range
	-- of doubles
	if not a or a < 1 or a >= 2 ^ 53 or a % 1 ~= 0 or not b or b < 0 or
		b >= 2 ^ 53 or b % 1 ~= 0 or
		(id == 1 and (a > 2 ^ 50 or b > 2 ^ 50 + 40 or b % a > 40)) then
		return nil, 'bad parameters'
	end
	local shadow = argv[o + 4]
	if shadow == '0' then return id, a, b, false end
	if shadow == '1' then return id, a, b, true end
	local fl, field = string.match(shadow, '^(%d+)#([^|=]+)$')
	if field then
		fl = fl + 0
		return id, a, b, fl % 2 == 1, '|' .. field .. '=', fl % 4 >= 2
	end
	return id, a, b, (tonumber(shadow) or 0) % 2 == 1
end

-- One decision at <now>: <n> limits with keys KEYS[kb + 1..kb + n] and <na>
-- arguments ARGV[ab + 1..ab + na], laid out as in the single form (or, with
-- <specs>, the compact multi form's: a limit is its index in <specs> and its
-- cost). Returns
-- its reply, or an error reply (bad arguments: nothing is written). <lim>
-- and <res> are scratch arrays (their contents are overwritten), or nil: then
-- they are made if needed. <cache>, if not nil, holds what the decisions of
-- one call convert again and again (they share limits): the numbers of arguments by
-- their text, and the text of TTLs by their number. <st>: the call's states
-- (state.lua); what the decision charged there is written when it ends.
local function decide(ALG, check, parse_limit, st, kb, n, ab, na, now, lim, res, cache, specs)
	local tonumber, argv = tonumber, ARGV
	st.fb = nil
	local w = 5 -- arguments per limit
	if specs then w = 2 end
	local batch = na >= w * n + 3
	local want = 1
	local report = false
	local minu = 1
	local life = 0
	if batch then
		local o = ab + w * n
		want = tonumber(argv[o + 1])
		report = tonumber(argv[o + 2]) == 1
		life = tonumber(argv[o + 3]) or 0
		if na >= w * n + 4 then minu = tonumber(argv[o + 4]) or 1 end
		if not want or want < 1 or want > 2 ^ 50 or want ~= math.floor(want) then
			return redis.error_reply('bad batch size ' .. tostring(argv[o + 1]))
		end
	end

	-- 7 per limit in <lim>: id, a, b, shadow, cost, field, fb. The arguments the agent
	-- sends most ("1", "0") are compared as strings (interned: one
	-- comparison).
	for i = 1, n do
		local o = ab + w * i - w
		local id, a, b, shadow, field, fb
		if specs then
			local s = argv[o + 1]
			local si = 1
			if s ~= '1' then si = tonumber(s) end
			if not si or si < 1 or si > specs[0] or si % 1 ~= 0 then
				return redis.error_reply('bad limit index ' .. tostring(s))
			end
			si = 6 * si
			id, a, b, shadow = specs[si - 5], specs[si - 4], specs[si - 3], specs[si - 2]
			field, fb = specs[si - 1], specs[si]
		else
			id, a, b, shadow, field, fb = parse_limit(argv, o, cache)
			if not id then
				return redis.error_reply(a == 'bad parameters' and
					'bad parameters for limit ' .. i or a)
			end
		end
		local cost = argv[o + w]
		if cost == '1' then
			cost = 1
		else
			cost = tonumber(cost)
			if not cost or cost ~= math.floor(cost) then
				return redis.error_reply('bad cost ' .. tostring(argv[o + w]))
			end
			-- clamped to +-COUNT_MAX
			if cost > 2 ^ 50 then cost = 2 ^ 50 elseif cost < -2 ^ 50 then cost = -2 ^ 50 end
		end
		if n == 1 and not batch then
			-- one limit and no batch, what most decisions are: what the rest
			-- of this function does, without the arrays
			local key = KEYS[kb + 1]
			local zset = id == 3 or id == 6
			local v, at = key, nil
			if not zset then v, at = ALG.read(st, key, field, fb) end
			local ok, rc, ru, retry, sc, su, s1, s2 = ALG[2 * id - 1](v, now, cost, a, b, at)
			if cost < 0 then ok = 1; retry = 0 end
			local allowed = 1
			if ok == 0 and not shadow then allowed = 0 end
			if allowed == 1 and ok == 1 then
				if zset then
					ALG[2 * id](key, now, cost, a, b, s1, s2)
				else
					local v, ttl = ALG[2 * id](now, cost, a, b, s1, s2)
					ALG.write(st, key, field, v, ttl, cache)
					ALG.flush(st, now)
				end
				ru, su = rc, sc
			end
			if retry ~= 0 then retry = math.ceil(retry / 1000) end
			return { allowed, 1, now, ok, ru, retry, math.ceil(su / 1000) }
		end
		local l = 7 * i - 7
		lim = lim or {}
		lim[l + 1], lim[l + 2], lim[l + 3], lim[l + 4], lim[l + 5] = id, a, b, shadow, cost
		lim[l + 6], lim[l + 7] = field, fb
	end

	res = res or { 0, 0, 0, 0, 0, 0, 0, 0, 0 }
	local floor = math.floor
	-- A report charges all <want> units: checked for them at once (what is
	-- left, rem_u, does not depend on the cost asked).
	local allowed = check(ALG, st, res, lim, n, kb, now, report and want or 1)
	local granted = allowed
	if batch and want > 1 and (allowed == 1 or report) then
		-- the most units every enforcing limit admits: what is left, in units
		local fit = want
		for i = 1, n do
			local o = 7 * i - 7
			local cost = lim[o + 5]
			if not lim[o + 4] and cost > 0 then
				local u = floor(res[9 * i - 6] / cost)
				if u < fit then fit = u end
			end
			if lim[o + 1] == 3 and cost > 0 and not report then
				-- a sliding log grows by at most LOG_ADD_MAX entries a call
				local u = floor(100 / cost)
				if u < fit then fit = u end
			end
		end
		if report then
			granted = fit
			allowed = 1
		else
			if fit < 1 then fit = 1 end
			if fit < minu and minu <= want then
				-- wait for a whole lease if it comes soon enough
				local rm = {}
				local _, wait = check(ALG, st, rm, lim, n, kb, now, minu)
				if wait > 0 and wait <= life then
					res, allowed, granted, fit = rm, 0, 0, 0
				end
			end
		end
		if allowed == 1 and not report then
			local r2, ok2 = res, allowed
			if fit > 1 then
				r2 = {}
				ok2 = check(ALG, st, r2, lim, n, kb, now, fit)
			end
			-- rem_u is exact for every algorithm; search down if rounding disagrees
			if ok2 == 0 then
				local lo, hi = 1, fit - 1
				while lo < hi do
					local mid = floor((lo + hi + 1) / 2)
					if check(ALG, st, {}, lim, n, kb, now, mid) == 1 then lo = mid else hi = mid - 1 end
				end
				fit = lo
				r2 = {}
				ok2 = check(ALG, st, r2, lim, n, kb, now, fit)
			end
			res, granted = r2, fit
		end
	elseif batch and report then
		-- a report of one unit: charged even when it no longer fits
		granted = allowed
		allowed = 1
	elseif batch and allowed == 0 and minu > 1 and minu <= want then
		-- denied: the retry is for a whole batch when it comes soon enough
		local rm = {}
		local _, wait = check(ALG, st, rm, lim, n, kb, now, minu)
		if wait <= life then res = rm end
	end

	local lease_ms = 0
	if batch then
		for i = 1, n do
			local o = 7 * i - 7
			if lim[o + 1] == 2 or lim[o + 1] == 4 then -- a = the window
				local a = lim[o + 2]
				local left = (floor(now / a) + 1) * a - now
				if left < life then life = left end
			elseif lim[o + 1] == 5 then -- a calendar month
				local left = month_start(month_index(now) + 1) - now
				if left < life then life = left end
			end
		end
		lease_ms = floor(life / 1000)
	end

	-- charges what passed, in the order of the limits; the reply
	local ceil, keys = math.ceil, KEYS
	local out
	for i = 1, n do
		local o, r = 7 * i - 7, 9 * i - 9
		local ok = res[r + 1]
		local rem, reset = res[r + 3], res[r + 6]
		if allowed == 1 and (ok == 1 or report) then
			local id = lim[o + 1]
			if id == 3 or id == 6 then
				ALG[2 * id](keys[kb + i], now, res[r + 7], lim[o + 2], lim[o + 3], res[r + 8])
			else
				local v, ttl = ALG[2 * id](now, res[r + 7], lim[o + 2], lim[o + 3], res[r + 8],
					res[r + 9])
				ALG.write(st, keys[kb + i], lim[o + 6], v, ttl, cache)
			end
			rem, reset = res[r + 2], res[r + 5]
		end
		if i == 1 then
			out = { allowed, n, now, ok, rem, ceil(res[r + 4] / 1000), ceil(reset / 1000) }
		else
			local j = 4 * i - 1
			out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok, rem, ceil(res[r + 4] / 1000),
				ceil(reset / 1000)
		end
	end
	if n == 0 then out = { allowed, 0, now } end
	ALG.flush(st, now)
	if batch then
		local j = 4 * n + 3
		out[j + 1] = (allowed == 1) and granted or 0
		out[j + 2] = lease_ms
	end
	return out
end

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]

local form = ARGV[1]
if form ~= 'M' and form ~= 'X' and form ~= 'C' and form ~= 'Q' then
	return decide(ALG, check, parse_limit, { nd = 0 }, 0, #KEYS, 0, #ARGV, now, nil, nil, nil,
		nil)
end

-- The multi form. The counts are checked for the whole call before any
-- decision is made: a decision never reads another's arguments. The counts
-- the agent sends most ("1" limit, "0" arguments after) are compared as
-- strings.
local argv, tonumber = ARGV, tonumber
local base = 2 -- the arguments before the first decision's counts
if form == 'X' or form == 'Q' then
	local K, keys = tonumber(argv[3]), KEYS
	if not K or K < 0 or K % 1 ~= 0 or 3 + K > #argv then
		return redis.error_reply('bad key count ' .. tostring(argv[3]))
	end
	local k0 = #keys
	for i = 1, K do keys[k0 + i] = argv[3 + i] end
	base = 3 + K
end
local specs, w = nil, 5 -- the call's limits (compact forms), arguments per limit
if form == 'C' or form == 'Q' then
	local U = tonumber(argv[base + 1])
	if not U or U < 0 or U % 1 ~= 0 or base + 1 + 4 * U > #argv then
		return redis.error_reply('bad limit count ' .. tostring(argv[base + 1]))
	end
	specs = { [0] = U }
	for u = 1, U do
		local id, a, b, shadow, field, fb = parse_limit(argv, base + 4 * u - 3, nil)
		if not id then
			return redis.error_reply(a == 'bad parameters' and
				'bad parameters for limit ' .. u or a)
		end
		local o = 6 * u
		specs[o - 5], specs[o - 4], specs[o - 3], specs[o - 2] = id, a, b, shadow
		specs[o - 1], specs[o] = field, fb
	end
	base, w = base + 1 + 4 * U, 2
end
local nk, na = #KEYS, #argv
local D = tonumber(argv[2])
if not D or D < 0 or D ~= math.floor(D) then
	return redis.error_reply('bad decision count ' .. tostring(argv[2]))
end
local at = {} -- per decision: its number of limits and of arguments
local kb, ab = 0, base
local arrays = false -- a decision needs the scratch arrays (see decide())
for j = 1, D do
	if ab + 2 > na then
		return redis.error_reply('decision ' .. j .. ' goes past the keys or arguments')
	end
	local n, x = argv[ab + 1], argv[ab + 2]
	if n == '1' and x == '0' then
		n, x = 1, 0
	else
		n, x = tonumber(n), tonumber(x)
		if not n or n < 0 or n % 1 ~= 0 or not x or x < 0 or x % 1 ~= 0 then
			return redis.error_reply('bad counts for decision ' .. j)
		end
	end
	kb, ab = kb + n, ab + 2 + w * n + x
	if kb > nk or ab > na then
		return redis.error_reply('decision ' .. j .. ' goes past the keys or arguments')
	end
	at[2 * j - 1], at[2 * j] = n, w * n + x
	if n ~= 1 or x >= 3 then arrays = true end
end
if kb ~= nk or ab ~= na then
	return redis.error_reply('keys or arguments left after ' .. D .. ' decisions')
end

-- Makes decisions <from> to D into <out>, the first with its keys after
-- KEYS[kb] and its counts at ARGV[ab + 1]. A Redis command that fails (or a
-- script error) fails the decision where it happens: it ends this run, the
-- caller records the error and starts another run at the next decision.
local function run(ALG, check, decide, parse_limit, st, out, at, from, D, kb, ab, now, lim,
		   res, cache, specs)
	for j = from, D do
		local n, nargs = at[2 * j - 1], at[2 * j]
		out[j] = decide(ALG, check, parse_limit, st, kb, n, ab + 2, nargs, now, lim, res, cache,
				specs)
		kb, ab = kb + n, ab + 2 + nargs
	end
end

local out, lim, res, cache, st = {}, nil, nil, nil, { nd = 0 }
if D > 1 then cache = {} end
if arrays then lim, res = { 0, 0, 0, 0, 0, 0, 0 }, { 0, 0, 0, 0, 0, 0, 0, 0, 0 } end
local from = 1
kb, ab = 0, base
while from <= D do
	local ok, e = pcall(run, ALG, check, decide, parse_limit, st, out, at, from, D, kb, ab, now,
			    lim, res, cache, specs)
	if ok then break end
	state_reset(st)
	if type(e) == 'table' and e.err then e = e.err end
	local j = #out + 1
	out[j] = redis.error_reply(tostring(e))
	for i = from, j do kb, ab = kb + at[2 * i - 1], ab + 2 + at[2 * i] end
	from = j + 1
end
return out
