"""The Lua scripts Sluice runs, one constant each, with the keys and arguments they take.

Scripts never build key names: every key arrives in KEYS (built by :mod:`store.keys`),
so prefixes and Redis Cluster hash tags stay right. Each script touches one hash tag.
"""

from __future__ import annotations

__all__ = ["COMMIT", "DEAD_LETTER", "DELIVER", "LEASE_ACQUIRE", "LEASE_RENEW", "LEASE_RELEASE", "FENCE", "PROJECT"]

STALE = "SLUICE_STALE"

# Compare two stream ids "ms-seq"; true when a > b.
_NEWER = """
local function newer(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
"""

COMMIT = """
-- Atomic, fenced commit of the events some messages caused.
-- KEYS[1]  fence key of the tag being written
-- KEYS[2]  inbox stream the consumed entries belong to (any key of the tag if none)
-- KEYS[3..] streams the events are appended to (all in the same tag)
-- ARGV[1]  writer epoch
-- ARGV[2]  consumer group of the inbox, '' when no inbox entry is consumed
-- ARGV[3]  n, the number of consumed inbox entries; ARGV[4 .. 3+n] their ids
-- ARGV[4+n ..] per event, three values: index into KEYS, encoded envelope, outbox target ('' if none)
-- Returns {'OK', id...} | {'DUP'} (an entry was already acknowledged: a redelivery; nothing
-- is written or acknowledged) | error 'SLUICE_STALE <fence>'
local epoch = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if epoch < fence then
  return redis.error_reply('SLUICE_STALE ' .. fence)
end
local n = tonumber(ARGV[3])
if ARGV[2] ~= '' and n > 0 then
  if n == 1 then
    if redis.call('XACK', KEYS[2], ARGV[2], ARGV[4]) == 0 then
      return {'DUP'}
    end
  else
    for i = 4, 3 + n do
      if #redis.call('XPENDING', KEYS[2], ARGV[2], ARGV[i], ARGV[i], 1) == 0 then
        return {'DUP'}
      end
    end
    local ids = {}
    for i = 4, 3 + n do
      ids[#ids + 1] = ARGV[i]
    end
    redis.call('XACK', KEYS[2], ARGV[2], unpack(ids))
  end
end
if epoch > fence then
  redis.call('SET', KEYS[1], epoch)
end
local out = {'OK'}
for i = 4 + n, #ARGV, 3 do
  local key = KEYS[tonumber(ARGV[i])]
  if ARGV[i + 2] == '' then
    out[#out + 1] = redis.call('XADD', key, '*', 'e', ARGV[i + 1])
  else
    out[#out + 1] = redis.call('XADD', key, '*', 'e', ARGV[i + 1], 'to', ARGV[i + 2])
  end
end
return out
"""

DEAD_LETTER = """
-- Park an entry that cannot be decoded, and acknowledge it, in one step.
-- KEYS[1]  the stream the entry is in
-- KEYS[2]  the dead-letter stream of the same tag
-- ARGV[1]  consumer group ('' when the entry was not read through a group)
-- ARGV[2]  entry id
-- ARGV[3]  error kind, ARGV[4] reason (what is wrong, for a person)
-- ARGV[5..] the entry's own fields and values, kept as they were
-- Returns the dead-letter entry id, or 0 when the entry was already parked by another consumer.
if ARGV[1] ~= '' then
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
    return 0
  end
end
local args = {KEYS[2], '*', 'stream', KEYS[1], 'entry', ARGV[2], 'kind', ARGV[3], 'reason', ARGV[4]}
for i = 5, #ARGV, 2 do
  args[#args + 1] = 'field:' .. ARGV[i]
  args[#args + 1] = ARGV[i + 1]
end
return redis.call('XADD', unpack(args))
"""

DELIVER = _NEWER + """
-- Deliver outbox entries into an inbox of another tag, each exactly once.
-- KEYS[1]  target inbox stream
-- KEYS[2]  target's delivered hash: origin outbox -> last outbox entry id delivered
-- ARGV[1]  origin outbox key
-- ARGV[2..] pairs: outbox entry id, encoded envelope (in outbox order)
-- Returns the number of entries appended (the rest were delivered before).
local last = redis.call('HGET', KEYS[2], ARGV[1])
local n = 0
for i = 2, #ARGV, 2 do
  if not last or newer(ARGV[i], last) then
    redis.call('XADD', KEYS[1], '*', 'e', ARGV[i + 1], 'from', ARGV[1], 'ref', ARGV[i])
    last = ARGV[i]
    n = n + 1
  end
end
if n > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], last)
end
return n
"""

LEASE_ACQUIRE = """
-- Take the leadership lease if nobody holds it; a takeover increases the epoch.
-- KEYS[1] lease hash (holder, epoch), KEYS[2] epoch counter, KEYS[3] fence of the cluster tag
-- ARGV[1] holder id, ARGV[2] lease time in ms
-- Returns {epoch, 1} when taken now, {epoch, 0} when already held by this holder (renewed),
-- {epoch_of_other_holder, -ttl_left_ms} when someone else holds it.
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder then
  local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {epoch, 0}
  end
  return {epoch, -redis.call('PTTL', KEYS[1])}
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'epoch', epoch)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local fence = tonumber(redis.call('GET', KEYS[3]) or '0')
if epoch > fence then
  redis.call('SET', KEYS[3], epoch)
end
return {epoch, 1}
"""

LEASE_RENEW = """
-- Extend the lease if this holder still has it at this epoch.
-- KEYS[1] lease hash; ARGV[1] holder id, ARGV[2] epoch, ARGV[3] lease time in ms
-- Returns 1 when renewed, 0 when the lease is gone or held by another.
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
"""

LEASE_RELEASE = """
-- Give the lease up (graceful stop) so a standby need not wait for it to expire.
-- KEYS[1] lease hash; ARGV[1] holder id, ARGV[2] epoch
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

FENCE = """
-- Raise a tag's fence to the writer's epoch (a new leader claims the tag).
-- KEYS[1] fence key; ARGV[1] epoch
-- Returns the fence now in force; an error 'SLUICE_STALE <fence>' if the epoch is older.
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < fence then
  return redis.error_reply('SLUICE_STALE ' .. fence)
end
redis.call('SET', KEYS[1], epoch)
return epoch
"""

PROJECT = """
-- Write a read model's changed rows together with the log position they reflect, once.
-- KEYS[1] position key, KEYS[2] table hash
-- ARGV[1] position the writer started from ('' for none), ARGV[2] new position,
-- ARGV[3] number of rows to set (n), ARGV[4 .. 3+2n] field/value pairs, then fields to delete
-- Returns 1 when written, 0 when the position moved meanwhile (already projected).
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then
  return 0
end
local n = tonumber(ARGV[3])
local i = 4
if n > 0 then
  local args = {}
  for j = 1, 2 * n do
    args[j] = ARGV[i]
    i = i + 1
  end
  redis.call('HSET', KEYS[2], unpack(args))
end
if i <= #ARGV then
  local dels = {}
  for j = i, #ARGV do
    dels[#dels + 1] = ARGV[j]
  end
  redis.call('HDEL', KEYS[2], unpack(dels))
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
