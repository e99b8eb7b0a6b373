-- SPDX-License-Identifier: MIT
-- Gateway heartbeat: how many agents use this Redis now. Each agent process
-- calls it about once a second; the answer sizes its leases (src/policy/quota.c) and
-- divides its local fallback limits (src/policy/heartbeat.c, fallback.gateways).
--
-- KEYS[1]   the registry, a sorted set: member = agent id, score = Redis time
--           (ms) of its last heartbeat
-- ARGV[1]   this agent's id
-- ARGV[2]   liveness window (ms): an agent silent for longer is gone
--
-- Returns the number of live agents, this one included.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win = tonumber(ARGV[2])
if not win or win < 1 then return redis.error_reply('bad window') end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - win)
redis.call('PEXPIRE', KEYS[1], 2 * win)
return redis.call('ZCARD', KEYS[1])
