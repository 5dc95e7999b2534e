// A third-party client of kvarenad: lists the services by server reflection, then calls
// grpc.health.v1.Health/Check and kvarena.v1.KvCacheService Allocate/Stats with JSON
// messages, using only descriptors the daemon served (no local .proto file).
//
// Usage: node reflection_client.js unix:/path/to/kvarena.sock   (or HOST:PORT)
'use strict';

const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { GrpcReflection } = require('grpc-js-reflection-client');

const address = process.argv[2];
if (!address) {
  console.error('usage: node reflection_client.js ADDRESS');
  process.exit(2);
}
const credentials = grpc.credentials.createInsecure();
const loaderOptions = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 10000 }, (err, response) =>
      (err ? reject(err) : resolve(response)));
  });
}

// The service constructor for `service` ("pkg.sub.Service"), from reflection alone.
async function serviceByReflection(reflection, service) {
  const descriptor = await reflection.getDescriptorBySymbol(service);
  let node = descriptor.getPackageObject(loaderOptions);
  for (const part of service.split('.')) node = node[part];
  assert.equal(typeof node, 'function', `reflection gave no client for ${service}`);
  return node;
}

async function main() {
  // gRPC 1.51 serves reflection v1alpha only.
  const reflection = new GrpcReflection(address, credentials, {}, 'v1alpha');
  const services = await reflection.listServices();
  console.log('services:', JSON.stringify(services));
  for (const want of ['kvarena.v1.KvCacheService', 'grpc.health.v1.Health',
                      'grpc.reflection.v1alpha.ServerReflection']) {
    assert.ok(services.includes(want), `reflection does not list ${want}`);
  }

  const Health = await serviceByReflection(reflection, 'grpc.health.v1.Health');
  const health = new Health(address, credentials);
  for (const service of ['', 'kvarena.v1.KvCacheService']) {
    const reply = await call(health, 'Check', { service });
    console.log(`health(${JSON.stringify(service)}):`, JSON.stringify(reply));
    assert.equal(reply.status, 'SERVING');
  }

  const KvCacheService = await serviceByReflection(reflection, 'kvarena.v1.KvCacheService');
  const kv = new KvCacheService(address, credentials);
  const allocated = await call(kv, 'Allocate', {
    spec: { num_layers: 2, num_kv_heads: 1, head_dim: 4, dtype: 'FLOAT32', page_size: 4 },
    cache_id: 'node-client',
  });
  assert.equal(allocated.cache.cache_id, 'node-client');
  assert.equal(allocated.cache.spec.dtype, 'FLOAT32');

  const stats = await call(kv, 'Stats', {});
  console.log('stats:', JSON.stringify(stats));
  assert.equal(stats.backend, 'host');
  assert.equal(stats.num_caches, '1');
  assert.ok(BigInt(stats.arena_bytes) > 0n);
  const one = await call(kv, 'Stats', { cache_id: 'node-client' });
  assert.equal(one.pages.layers_total, 2);

  await call(kv, 'Release', { cache_id: 'node-client' });
  for (const client of [health, kv]) client.close();
  console.log('node reflection client: ok');
}

main().catch((err) => {
  console.error('node reflection client failed:', err);
  process.exit(1);
});
