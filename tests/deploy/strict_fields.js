// Unknown-field rejection for Kubernetes manifests, from kubernetes-models' own types.
//
// kubernetes-models' validators (compiled JSON Schema) check types, enums and required
// fields but accept any field they do not know, as the Kubernetes OpenAPI schema does
// (no additionalProperties). The API server would reject such a field (strict field
// validation) or drop it; either way a typo like `runAsNonroot` must fail here. The
// package's TypeScript declarations are generated from the same schema and list every
// field of every type, so this walks a manifest alongside them: each key of each object
// must be declared by its type (or fall under a declared map).
//
// It reads the generated .d.ts files with a small parser for the subset they use
// (interfaces, type aliases, Array<T>, inline object types, index signatures, unions,
// literals) and throws on anything else, so a change in their form fails loudly instead
// of checking less.
'use strict';

const fs = require('fs');
const path = require('path');

// Where each apiVersion's models live: [package, directory inside it].
const kGroups = {
  'v1': ['kubernetes-models', 'v1'],
  'apps/v1': ['kubernetes-models', 'apps/v1'],
  'policy/v1': ['kubernetes-models', 'policy/v1'],
  'networking.k8s.io/v1': ['kubernetes-models', 'networking.k8s.io/v1'],
  'rbac.authorization.k8s.io/v1': ['kubernetes-models', 'rbac.authorization.k8s.io/v1'],
  'monitoring.coreos.com/v1': ['@kubernetes-models/prometheus-operator', 'monitoring.coreos.com/v1'],
};

const kPrimitives = new Set(['string', 'number', 'boolean', 'null', 'undefined', 'never', 'true',
                             'false', 'bigint']);
const kFree = new Set(['any', 'unknown', 'object']);  // free-form (RawExtension, JSON)

function packageRoot(name, fromDir) {
  return path.dirname(require.resolve(name, {paths: [fromDir]}));
}

// The model class (for .validate()) and the .d.ts file of an object's apiVersion/kind.
function modelFor(apiVersion, kind) {
  const group = kGroups[apiVersion];
  if (!group) throw new Error(`no kubernetes-models package known for apiVersion ${apiVersion}`);
  const [pkg, dir] = group;
  const Model = require(`${pkg}/${dir}`)[kind];
  if (typeof Model !== 'function') throw new Error(`${pkg} has no ${apiVersion} ${kind}`);
  const dts = path.join(packageRoot(pkg, __dirname), dir, `${kind}.d.ts`);
  return {Model, dts, typeName: `I${kind}`};
}

// ---- a tokenizer and parser for the generated declarations ----

const kToken = /\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_$][\w$]*|-?\d+(?:\.\d+)?|[{}[\]<>();:?|,.=&])/y;

function stripComments(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, ' ').replace(/\/\/[^\n]*/g, ' ');
}

class Parser {
  constructor(text, file, at) {
    this.text = text;
    this.file = file;
    this.at = at;
  }
  fail(what) {
    const line = this.text.slice(0, this.at).split('\n').length;
    throw new Error(`${this.file}:${line}: cannot read the declaration: ${what}`);
  }
  peek() {
    kToken.lastIndex = this.at;
    const m = kToken.exec(this.text);
    return m ? m[1] : null;
  }
  next() {
    kToken.lastIndex = this.at;
    const m = kToken.exec(this.text);
    if (!m) this.fail('unexpected end');
    this.at = kToken.lastIndex;
    return m[1];
  }
  expect(token) {
    const t = this.next();
    if (t !== token) this.fail(`expected '${token}', found '${t}'`);
  }
  // '{' members '}' : an object type.
  object() {
    this.expect('{');
    const props = new Map();
    let index = null;
    while (this.peek() !== '}') {
      const t = this.next();
      if (t === '[') {  // [key: string]: T
        this.next();
        this.expect(':');
        if (this.next() !== 'string') this.fail('an index signature keyed by other than string');
        this.expect(']');
        this.expect(':');
        index = this.type();
      } else if (/^["']/.test(t) || /^[A-Za-z_$]/.test(t)) {
        const name = /^["']/.test(t) ? JSON.parse(t.replace(/^'|'$/g, '"')) : t;
        if (this.peek() === '?') this.next();
        this.expect(':');
        props.set(name, this.type());
      } else {
        this.fail(`unexpected '${t}' in an object type`);
      }
      const sep = this.peek();
      if (sep === ';' || sep === ',') this.next();
    }
    this.expect('}');
    return {kind: 'object', props, index};
  }
  type() {
    if (this.peek() === '|') this.next();
    const members = [this.postfix()];
    while (this.peek() === '|') {
      this.next();
      members.push(this.postfix());
    }
    return members.length === 1 ? members[0] : {kind: 'union', members};
  }
  postfix() {
    let t = this.primary();
    while (this.peek() === '[') {
      this.next();
      if (this.peek() === ']') {
        this.next();
        t = {kind: 'array', of: t};
      } else {
        this.fail('an indexed access type');
      }
    }
    return t;
  }
  primary() {
    const t = this.peek();
    if (t === '{') return this.object();
    this.next();
    if (t === '(') {
      const inner = this.type();
      this.expect(')');
      return inner;
    }
    if (/^["'\d-]/.test(t) || kPrimitives.has(t)) return {kind: 'leaf'};
    if (kFree.has(t)) return {kind: 'free'};
    if (t === 'Array') {
      this.expect('<');
      const of = this.type();
      this.expect('>');
      return {kind: 'array', of};
    }
    if (/^[A-Za-z_$]/.test(t)) {
      if (this.peek() === '<' || this.peek() === '.') this.fail(`a generic or qualified type ${t}`);
      return {kind: 'ref', name: t, file: this.file};
    }
    return this.fail(`unexpected '${t}'`);
  }
}

// One declaration file: its imports, aliases, interfaces and type aliases.
class DeclarationFile {
  constructor(file) {
    this.file = file;
    this.text = stripComments(fs.readFileSync(file, 'utf8'));
    this.imports = new Map();  // local name -> module specifier
    for (const m of this.text.matchAll(/import\s*{([^}]*)}\s*from\s*"([^"]+)"/g)) {
      for (const part of m[1].split(',').map((s) => s.trim()).filter(Boolean)) {
        const [name, local] = part.split(/\s+as\s+/);
        this.imports.set((local || name).trim(), m[2]);
      }
    }
    this.exported = new Map();  // exported name -> local name
    for (const m of this.text.matchAll(/export\s*{([^}]*)}\s*;/g)) {
      for (const part of m[1].split(',').map((s) => s.trim()).filter(Boolean)) {
        const [name, as] = part.split(/\s+as\s+/);
        this.exported.set((as || name).trim(), name.trim());
      }
    }
    this.declared = new Map();  // local name -> parsed type (lazily)
  }
  declaration(name) {
    if (this.declared.has(name)) return this.declared.get(name);
    let type = null;
    const iface = new RegExp(`export\\s+interface\\s+${name}\\s*(?:extends\\s+([\\w\\s,]+?))?\\s*{`);
    const alias = new RegExp(`export\\s+declare\\s+type\\s+${name}\\s*=`);
    let m;
    if ((m = iface.exec(this.text))) {
      for (const base of (m[1] || '').split(',').map((s) => s.trim()).filter(Boolean)) {
        // TypeMeta is apiVersion + kind, which every model interface declares itself.
        if (base !== 'TypeMeta') throw new Error(`${this.file}: ${name} extends ${base}`);
      }
      type = new Parser(this.text, this.file, m.index + m[0].length - 1).object();
    } else if ((m = alias.exec(this.text))) {
      type = new Parser(this.text, this.file, m.index + m[0].length).type();
    }
    this.declared.set(name, type);
    return type;
  }
}

class StrictFields {
  constructor() {
    this.files = new Map();
  }
  load(file) {
    if (!this.files.has(file)) this.files.set(file, new DeclarationFile(file));
    return this.files.get(file);
  }
  // The declaration `name` refers to as seen from `file`: {type, name}.
  resolve(file, name) {
    const decl = this.load(file);
    const local = decl.declaration(name) || decl.declaration(decl.exported.get(name) || '');
    if (local) return {type: local, name};
    const spec = decl.imports.get(name);
    if (!spec) throw new Error(`${file}: ${name} is neither declared nor imported`);
    let target;
    if (spec.startsWith('.')) {
      target = path.resolve(path.dirname(file), `${spec}.d.ts`);
    } else {
      const parts = spec.split('/');
      const pkg = spec.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
      const rest = parts.slice(pkg.split('/').length).join('/');
      target = path.join(packageRoot(pkg, path.dirname(file)), `${rest}.d.ts`);
    }
    const imported = this.load(target);
    const type = imported.declaration(name) || imported.declaration(imported.exported.get(name) || '');
    if (!type) throw new Error(`${target}: no declaration of ${name}`);
    return {type, name};
  }
  deref(type, name) {
    while (type.kind === 'ref') ({type, name} = this.resolve(type.file, type.name));
    return {type, name};
  }
  // Every unknown field of `value` (of `type`, called `name`), as "path: message".
  walk(value, type, name, at, errors) {
    ({type, name} = this.deref(type, name));
    if (value === null || typeof value !== 'object') return;
    switch (type.kind) {
      case 'object':
        if (Array.isArray(value)) return;  // a wrong type: the schema validator says so
        for (const [key, child] of Object.entries(value)) {
          const where = `${at}.${key}`;
          if (type.props.has(key)) {
            this.walk(child, type.props.get(key), `${name}.${key}`, where, errors);
          } else if (type.index) {
            this.walk(child, type.index, `${name}[key]`, where, errors);
          } else {
            errors.push(`${where}: unknown field "${key}" (${name} declares: ${[...type.props.keys()].join(', ')})`);
          }
        }
        return;
      case 'array':
        if (Array.isArray(value)) value.forEach((v, i) => this.walk(v, type.of, name, `${at}[${i}]`, errors));
        return;
      case 'union': {
        const fits = type.members.map((m) => this.deref(m, name)).filter(
            ({type: t}) => Array.isArray(value) ? t.kind === 'array' : t.kind === 'object' || t.kind === 'free');
        if (fits.some(({type: t}) => t.kind === 'free')) return;
        let best = null;
        for (const f of fits) {  // the member that fits with the fewest unknown fields
          const e = [];
          this.walk(value, f.type, f.name, at, e);
          if (best === null || e.length < best.length) best = e;
        }
        if (best) errors.push(...best);
        return;
      }
      default:  // leaf (a scalar: the schema validator checks it) or free-form
        return;
    }
  }
  // Unknown fields of one manifest: [] when every field is declared.
  check(manifest) {
    const {dts, typeName} = modelFor(manifest.apiVersion, manifest.kind);
    const errors = [];
    this.walk(manifest, {kind: 'ref', name: typeName, file: dts}, manifest.kind, manifest.kind, errors);
    return errors;
  }
}

// Schema errors of one manifest from kubernetes-models' validator: [] when valid.
function schemaErrors(manifest) {
  const {Model} = modelFor(manifest.apiVersion, manifest.kind);
  try {
    new Model(manifest).validate();
    return [];
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    return e.errors.map((x) => `${manifest.kind}${x.instancePath.replace(/\//g, '.')}: ${x.message}`);
  }
}

module.exports = {StrictFields, schemaErrors, modelFor};
