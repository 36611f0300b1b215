#pragma once

// The Redis store's Lua scripts: one per step, each one round trip (EVALSHA) that reads the
// record, applies SPEC §4 by the server's clock (TIME) and writes. Every script touches one
// key, the record's (KEYS[1]). Values are laid out as redis_layout.h describes; `struct` is
// the library Redis bundles with its Lua.
//
// Shared rules:
//  - now = TIME in ms; tokens are TIME in µs, raised above the record's token when the key
//    still holds one (docs/stores/redis.md, "Tokens").
//  - A key expires 1 ms before the instant SPEC §4 allows its record to be dropped, because
//    Redis keeps a key while now <= its expiry time: a COMPLETE record exactly at
//    expires_at - 1 (PXAT), so a key that Redis still returns is a live result; an
//    IN_PROGRESS one at max(expires_at, lease_expires_at) - 1 or up to 1 ms later (PX from
//    the script's start, or KEEPTTL), never earlier. And never before the token's
//    millisecond: a key vanishes only once the server clock has passed its token, so a
//    later token made from the clock is larger.
//  - Numbers reach Redis through struct.pack and command arguments, never through Lua's
//    string conversion (14 digits, too few for a token). Each script does the least on its
//    common path (measured in instructions with callgrind): a redis.call costs about as
//    much as the rest of a script, a returned table of numbers more than a string.

namespace idem::redis {

struct ScriptSource {
  const char* name;
  const char* body;
};

// ARGV: lease ms, ttl ms, fingerprint section, max(lease, ttl) ms. Replies: a COMPLETE
// value (Replay); {now, value} (Busy); the new IN_PROGRESS record's header and fingerprint
// (Acquired; its attempt > 1 means stolen).
//
// A replay needs no TIME: the key of a COMPLETE record expires at expires_at - 1 (unless its
// token's millisecond is later, a clock that stepped back), and Redis hides an expired key
// by the time the script started, so a key it returns is a live result. A new lease's key
// expires ARGV[4] ms after the script started: never before max(expires_at,
// lease_expires_at) - 1, at most 1 ms after (harmless for IN_PROGRESS), and a string from
// the client costs less than a number formatted in Lua.
inline constexpr ScriptSource kAcquireScript{"acquire", R"lua(
local v = redis.call('GET', KEYS[1])
local k, old, at, lease, exp, n
if v then
  k = string.byte(v)
  old, at, lease, exp, n = struct.unpack('>I8I8I8I8I4', v, 2)
  if k == 67 and exp - 1 >= math.floor(old / 1000) then return v end
end
local t = redis.call('TIME')
local tok = t[1] * 1000000 + t[2]
local now = math.floor(tok / 1000)
local att = 1
if v then
  if k == 67 then
    if exp > now then return v end
  elseif k == 80 then
    if lease > now then return {now, v} end
    att = n + 1
  elseif k ~= 84 then
    return redis.error_reply('ERR not an idem record')
  end
  if tok <= old then tok = old + 1 end
end
lease, exp = now + ARGV[1], now + ARGV[2]
local h = struct.pack('>BI8I8I8I8I4', 80, tok, now, lease, exp, att) .. ARGV[3]
if tok < (now + 1) * 1000 then
  redis.call('SET', KEYS[1], h, 'PX', ARGV[4])
else
  redis.call('SET', KEYS[1], h, 'PXAT', math.max(lease - 1, exp - 1, math.floor(tok / 1000)))
end
return h
)lua"};

// ARGV: token, ttl ms, payload. Replies 1 (done) or 0 (fenced). The expiry is exact
// (PXAT): replays trust a COMPLETE key's existence. A large payload is appended rather than
// concatenated in Lua, which would copy it twice more (half the time for megabytes); a
// small one is cheaper in one SET.
inline constexpr ScriptSource kCompleteScript{"complete", R"lua(
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local tok = struct.unpack('>I8', v, 2)
if tok ~= tonumber(ARGV[1]) then return 0 end
local k = string.byte(v)
if k == 67 then return 1 end
if k ~= 80 then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local exp = now + ARGV[2]
local head = struct.pack('>BI8I8I8I8I4', 67, tok, now, 0, exp, 0) .. string.sub(v, 38)
local px = exp - 1
if tok >= exp * 1000 then px = math.floor(tok / 1000) end
if #ARGV[3] < 65536 then
  redis.call('SET', KEYS[1], head .. ARGV[3], 'PXAT', px)
else
  redis.call('SET', KEYS[1], head, 'PXAT', px)
  redis.call('APPEND', KEYS[1], ARGV[3])
end
return 1
)lua"};

// ARGV: token (release: only an IN_PROGRESS record with it), or '' (forget: any record).
// Replies 1 (deleted) or 0 (fenced, or nothing to forget).
inline constexpr ScriptSource kDeleteScript{"delete", R"lua(
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local k = string.byte(v)
local tok = struct.unpack('>I8', v, 2)
if k == 84 or (ARGV[1] ~= '' and (k ~= 80 or tok ~= tonumber(ARGV[1]))) then return 0 end
local t = redis.call('TIME')
if t[1] * 1000000 + t[2] > tok then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], struct.pack('>BI8I8I8I8I4', 84, tok, 0, 0, 0, 0),
    'PXAT', math.floor(tok / 1000))
end
return 1
)lua"};

// ARGV: token, lease ms. Replies the new lease deadline (ms), or 0 (fenced). The key's
// expiry only moves out: kept when the TTL already outlasts the new lease (the usual
// heartbeat), else lease ms from the script's start.
inline constexpr ScriptSource kExtendScript{"extend", R"lua(
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v) ~= 80 then return 0 end
local tok, _, _, exp = struct.unpack('>I8I8I8I8', v, 2)
if tok ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = now + ARGV[2]
local nv = string.sub(v, 1, 17) .. struct.pack('>I8', lease) .. string.sub(v, 26)
if lease <= exp then
  redis.call('SET', KEYS[1], nv, 'KEEPTTL')
elseif tok < (now + 1) * 1000 then
  redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], nv, 'PXAT', math.max(lease - 1, exp - 1, math.floor(tok / 1000)))
end
return lease
)lua"};

// Reads without writing (get, and acquire on a read-only store). Replies {now, value}, or
// {now} when there is no record.
inline constexpr ScriptSource kPeekScript{"peek", R"lua(
local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if v and string.byte(v) ~= 84 then return {now, v} end
return {now}
)lua"};

enum ScriptId { kAcquire, kComplete, kDelete, kExtend, kPeek, kScriptCount };

inline constexpr const ScriptSource* kScripts[kScriptCount] = {
    &kAcquireScript, &kCompleteScript, &kDeleteScript, &kExtendScript, &kPeekScript};

}  // namespace idem::redis
