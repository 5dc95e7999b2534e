// A third-party client of kvarenad, working as an operator's tool (grpcurl's list, describe
// and call) does: every descriptor comes from server reflection, none from a .proto file.
//
// 1. list: the services reflection names include kvarena.v1.KvCacheService, health and
//    reflection itself.
// 2. describe: the methods reflection gives for kvarena.v1.KvCacheService — names, request
//    and response types, streaming — equal those of the wire contract. The contract's
//    .proto (argv[3]) is read as text for that comparison only; nothing is loaded from it.
// 3. call by name: methods are invoked by their full name ("kvarena.v1.KvCacheService/Stats")
//    through a generic gRPC client, with the path and (de)serializers of the reflected
//    descriptors: health Check, Allocate, Stats for the arena and for one cache, Stats of
//    an unknown cache (NOT_FOUND), Release.
//
// Usage: node reflection_client.js ADDRESS PROTO   (ADDRESS: unix:/path/to/kvarena.sock
//        or HOST:PORT; PROTO: proto/kvarena/v1/kvarena.proto)
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const grpc = require('@grpc/grpc-js');
const { GrpcReflection } = require('grpc-js-reflection-client');

const [address, protoPath] = process.argv.slice(2);
if (!address || !protoPath) {
  console.error('usage: node reflection_client.js ADDRESS PROTO');
  process.exit(2);
}
const credentials = grpc.credentials.createInsecure();
const kService = 'kvarena.v1.KvCacheService';

// The contract's rpc lines, as "Name(Request) returns (stream? Response)".
function contractMethods(protoText) {
  const service = protoText.match(/service KvCacheService \{([\s\S]*?)\n\}/);
  assert.ok(service, `${protoPath} has no service KvCacheService`);
  const rpc = /rpc (\w+)\((stream )?(\w+)\) returns \((stream )?(\w+)\);/g;
  return [...service[1].matchAll(rpc)].map(
    ([, name, reqStream, req, respStream, resp]) =>
      `${name}(${reqStream || ''}${req}) returns (${respStream || ''}${resp})`);
}

// The same line for a method definition reflection produced.
function describe({ name, definition }) {
  const stream = (s) => (s ? 'stream ' : '');
  return `${name}(${stream(definition.requestStream)}${definition.requestType.type.name}) ` +
         `returns (${stream(definition.responseStream)}${definition.responseType.type.name})`;
}

// Calls `fullName` ("package.Service/Method") as a generic client does: the path and the
// (de)serializers are those of the reflected method definition.
function invoke(client, methods, fullName, request) {
  const [service, method] = fullName.split('/');
  const found = (methods[service] || []).find((m) => m.name === method);
  assert.ok(found, `reflection describes no method ${fullName}`);
  const { path, requestSerialize, responseDeserialize, requestStream, responseStream } =
      found.definition;
  assert.equal(path, `/${fullName}`);
  assert.ok(!requestStream && !responseStream, `${fullName} is not unary`);
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(path, requestSerialize, responseDeserialize, request,
                            { deadline: Date.now() + 10000 },
                            (err, response) => (err ? reject(err) : resolve(response)));
  });
}

async function main() {
  // gRPC 1.51 serves reflection v1alpha only.
  const reflection = new GrpcReflection(address, credentials, {}, 'v1alpha');

  // 1. list
  const services = await reflection.listServices();
  console.log('services:', JSON.stringify(services));
  const wanted = [kService, 'grpc.health.v1.Health', 'grpc.reflection.v1alpha.ServerReflection'];
  for (const want of wanted) {
    assert.ok(services.includes(want), `reflection does not list ${want}`);
  }

  // 2. describe
  const methods = {};
  for (const service of [kService, 'grpc.health.v1.Health']) {
    methods[service] = await reflection.listMethods(service);
  }
  const described = methods[kService].map(describe);
  console.log(`${kService}:\n  ${described.join('\n  ')}`);
  const contract = contractMethods(fs.readFileSync(protoPath, 'utf8'));
  assert.ok(contract.length >= 17, `only ${contract.length} rpcs read from ${protoPath}`);
  assert.deepEqual([...described].sort(), [...contract].sort(),
                   `reflection's ${kService} differs from ${protoPath}`);

  // 3. call by name
  const client = new grpc.Client(address, credentials);
  for (const service of ['', kService]) {
    const reply = await invoke(client, methods, 'grpc.health.v1.Health/Check', { service });
    console.log(`health(${JSON.stringify(service)}):`, JSON.stringify(reply));
    assert.equal(reply.status, 'SERVING');
  }
  const allocated = await invoke(client, methods, `${kService}/Allocate`, {
    spec: { num_layers: 2, num_kv_heads: 1, head_dim: 4, dtype: 'FLOAT32', page_size: 4 },
    cache_id: 'node-client',
  });
  assert.equal(allocated.cache.cache_id, 'node-client');
  assert.equal(allocated.cache.spec.dtype, 'FLOAT32');

  const stats = await invoke(client, methods, `${kService}/Stats`, {});
  console.log('stats:', JSON.stringify(stats));
  assert.equal(stats.backend, 'host');
  assert.equal(stats.num_caches, '1');
  assert.ok(BigInt(stats.arena_bytes) > 0n);
  const one = await invoke(client, methods, `${kService}/Stats`, { cache_id: 'node-client' });
  assert.equal(one.pages.layers_total, 2);
  await assert.rejects(invoke(client, methods, `${kService}/Stats`, { cache_id: 'no-such-cache' }),
                       (err) => err.code === grpc.status.NOT_FOUND);

  await invoke(client, methods, `${kService}/Release`, { cache_id: 'node-client' });
  const after = await invoke(client, methods, `${kService}/Stats`, {});
  assert.equal(after.num_caches || '0', '0');
  client.close();
  console.log('node reflection client: ok');
}

main().catch((err) => {
  console.error('node reflection client failed:', err);
  process.exit(1);
});
