-- Where the limits' states live: the key layouts.
--
-- The algorithms that keep a string (gcra, fixed_window and its calendar
-- months, sliding_window) read and write no key themselves: their check is
-- given the state's text (or nil) and their commit returns the new text and
-- how long it matters (ms). The driver reads and writes them through the
-- functions below, in one of two layouts, which the limit's flags argument
-- says:
--
-- Layout 1: a key per limit, "<prefix>:{<principal>}:<limit>", the state as
--   its value, with its own expiry (PX). The flags argument is a number.
-- Layout 2: a key per principal, "<prefix>:v2:{<principal>}", holding when
--   it expires (Unix seconds of Redis time) then the states of all its
--   limits, each as "|<field>=<state>": <field> names the limit (its name,
--   "@<endpoint>" after it for an endpoint's, "c:" before it for a candidate
--   policy's). The flags argument is "<flags>#<field>" and the key given is the
--   principal's. A call reads the key once (GET) and writes it once per
--   decision that charged it (SET PX). It expires when its latest entry stops
--   mattering, rounded up to the second: the latest of the entries the
--   decision wrote or the expiry the key had, whichever is later (a refund
--   never shortens it). An entry is never dropped (a limit no longer
--   configured keeps its entry, never read, until the key expires); a state
--   past its time reads as no state, as in layout 1 (a bucket full again, a
--   window over). Text that is not an entry is left as it is. Flag 2: when the
--   key has no entry for the field, the limit's layout 1 key is read instead
--   (a fleet moving from layout 1: its state carries over; that read never
--   fails the call).
--
-- The sorted sets of sliding_log and concurrency are keys of their own in
-- both layouts (layout 1's name).
--
-- A limit in layout 2 is known here by its needle "|<field>=" (parse_limit()).
-- <st> is the call's table of the layout 2 keys read: st[key] = its text as
-- the call left it ("" for none), st[1..st.nd] the keys the decision changed,
-- written by state_flush() when it ends (st[-d]: the longest TTL, ms, of what it
-- wrote in key st[d]), and st.fb the layout 1 states the decision read (its
-- own: a decision of layout 1 after it in the call may write them; decide()
-- drops it). A decision that fails leaves the table to be dropped
-- (state_reset()): what it held unwritten is not seen by the next decision.

-- The state of a limit: a text and where in it the state starts (up to the
-- next "|" or the end; nil: at 1), or nil. <ndl> nil: layout 1 (<key> is
-- the limit's key).
local function state_read(st, key, ndl, fb)
	if not ndl then
		return redis.call('GET', key)
	end
	local s = st[key]
	if not s then
		s = redis.call('GET', key) or ''
		st[key] = s
	end
	local i = string.find(s, ndl, 1, true)
	if i then
		return s, i + #ndl
	end
	if not fb then
		return nil
	end
	-- "<prefix>:v2:{<principal>}" -> "<prefix>:{<principal>}:<field>"
	local k1 = string.find(key, ':v2:{', 1, true)
	if not k1 then
		return nil
	end
	k1 = string.sub(key, 1, k1) .. string.sub(key, k1 + 4) .. ':' ..
		string.sub(ndl, 2, -2)
	local o = st.fb
	if not o then
		o = {}
		st.fb = o
	end
	local v = o[k1]
	if v == nil then
		-- an error reads as no state: a key of another type, or, in a
		-- cluster, a key not on this node while its slot moves (usually one
		-- that never existed: failing the decision would fail every first
		-- decision of a limit there until the move ends)
		v = redis.pcall('GET', k1)
		if type(v) ~= 'string' then v = false end
		o[k1] = v
	end
	return v or nil
end

-- Writes the state <v> of a limit, which matters for <ttl> ms. Layout 1: at
-- once (<cache>, or nil, keeps the text of TTLs for the call's next
-- decisions); layout 2: into the call's table, written by state_flush().
local function state_write(st, key, ndl, v, ttl, cache)
	if not ndl then
		local px = cache and cache[ttl]
		if not px then
			px = string.format('%d', ttl)
			if cache then cache[ttl] = px end
		end
		redis.call('SET', key, v, 'PX', px)
		return
	end
	local s = st[key]
	local i = string.find(s, ndl, 1, true)
	if i then
		local j = string.find(s, '|', i + 1, true)
		if j then
			s = string.sub(s, 1, i - 1) .. ndl .. v .. string.sub(s, j)
		elseif i == 1 then
			s = ndl .. v
		else
			s = string.sub(s, 1, i - 1) .. ndl .. v
		end
	elseif s == '' then
		s = ndl .. v
	else
		s = s .. ndl .. v
	end
	st[key] = s
	for d = 1, st.nd do
		if st[d] == key then
			if ttl > st[-d] then st[-d] = ttl end
			return
		end
	end
	local d = st.nd + 1
	st.nd, st[d], st[-d] = d, key, ttl
end

-- Writes the layout 2 keys the decision changed at <now> (us), each expiring
-- when its latest entry stops mattering.
local function state_flush(st, now)
	local ms = (now - now % 1000) / 1000
	for d = 1, st.nd do
		local key = st[d]
		local s = st[key]
		local h = string.match(s, '^%d*')
		local exp = (ms + st[-d]) / 1000
		exp = exp + (-exp) % 1
		if h ~= '' then
			-- what the entries it did not write need: the key's expiry, if
			-- later (and sane: no state matters 2^32 s)
			local old = h + 0
			if old > exp and old <= exp + 2 ^ 32 then exp = old end
		end
		local hs = string.format('%d', exp)
		if hs ~= h then
			s = hs .. string.sub(s, #h + 1)
			st[key] = s
		end
		redis.call('SET', key, s, 'PX', string.format('%d', exp * 1000 - ms))
		st[d], st[-d] = nil, nil
	end
	st.nd = 0
end

-- Drops what the call's table holds (a decision failed).
local function state_reset(st)
	for k in pairs(st) do st[k] = nil end
	st.nd = 0
end
