-- Sliding window counter: the current and the previous fixed window, the
-- previous one weighted by how much of it still overlaps the sliding window.
-- Two numbers per key ("<window index>:<current>:<previous>"), close to the
-- sliding log without its memory. The weighted count prev x left / win is a
-- double (prev <= 2^50, left <= 2^45: no overflow; rounded, not exact, when
-- the product passes 2^53, identically in the C model); it only decides, the
-- counts stored are integers.
--   a = window length (us), b = limit (requests per window)
ALG[4] = function(key, now, cost, win, limit)
	local idx = math.floor(now / win)
	local cur, prev = 0, 0
	local v = redis.call('GET', key)
	if v then
		local w, c, p = string.match(v, '^(%d+):(%d+):(%d+)$')
		if w then
			w = tonumber(w)
			if w == idx then
				cur, prev = math.min(tonumber(c), COUNT_MAX), math.min(tonumber(p), COUNT_MAX)
			elseif w == idx - 1 then
				prev = math.min(tonumber(c), COUNT_MAX)
			end
		end
	end
	local elapsed = now - idx * win
	local left = win - elapsed
	local est = math.floor(prev * left / win) + cur
	local r = {}
	r.ok = (est + cost <= limit) and 1 or 0
	r.rem_c = clamp0(limit - clamp0(est + cost))
	r.rem_u = clamp0(limit - est)
	-- retry: the first instant the estimate admits <cost>. With the previous
	-- window weighing p and L tokens of room, floor(p * (win - e) / win) <= L
	-- holds from e = floor(win - (L + 1) * win / p) + 1 on.
	if r.ok == 1 then
		r.retry = 0
	elseif cost > limit then
		r.retry = left + win
	elseif cur + cost <= limit then
		local e = math.floor(win - (limit - cur - cost + 1) * win / prev) + 1
		r.retry = clamp0(e - elapsed)
		if r.retry < 1 then r.retry = 1 end
	elseif cur <= limit - cost then
		r.retry = left
	else
		-- in the next window this one's count becomes the previous weight
		local e = math.floor(win - (limit - cost + 1) * win / cur) + 1
		r.retry = left + clamp0(e)
	end
	r.reset_c = left + win
	r.reset_u = (cur > 0) and (left + win) or ((prev > 0) and left or 0)
	r.commit = function()
		local c = math.min(clamp0(cur + cost), COUNT_MAX)
		redis.call('SET', key, string.format('%d:%d:%d', idx, c, prev), 'PX',
			math.ceil((left + win) / 1000) + 1)
	end
	return r
end
