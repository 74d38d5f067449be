#!/usr/bin/env bash
# Rebuild plotly-stallscope.min.js: a partial plotly.js bundle with only the trace types the
# stallscope HTML report draws (scatter, heatmap), from the plotly.js npm package.
#
# What it does, in a fresh temp dir (removed on exit):
#   1. `npm pack plotly.js@4.1.1` and checks the tarball's sha512 against the one pinned below.
#      4.1.1 is the plotly.js that plotly.py 7.1.0 bundles, so figure JSON stays compatible.
#   2. Installs only what the bundle and the build need, every package pinned to an exact version
#      (no lockfile; `npm install --ignore-scripts`).
#   3. Writes the entry file (Plotly core + scatter + heatmap) and builds it the way plotly.js builds
#      its partial bundles (`npm run custom-bundle`, tasks/partial_bundle.mjs): esbuild with the
#      package's own esbuild-config.js, minified, plus the strip-meta-attributes plugin from
#      tasks/compress_attributes.js and the UMD wrapper from tasks/util/bundle_wrapper.mjs (tasks/
#      is not in the npm package, so both are reproduced inline below).
#      One deliberate difference: esbuild-plugin-inline-css names its <style> element by the
#      sha256 of the CSS file's absolute path, which would make the output depend on the temp
#      dir; here the path is taken relative to the package root, so rebuilds are byte-identical.
#   4. Prepends a header in the style of plotly's dist banners and writes, next to this script:
#        plotly-stallscope.min.js          the bundle
#        plotly-stallscope.min.js.sha256   its sha256 (`sha256sum` format; a test checks it)
#        PLOTLY_LICENSE                    plotly.js's LICENSE, verbatim from the package
#
# Needs: bash, node (>= 18; plotly.js 4 asks for 22 but builds with 20), npm, tar, sha256sum,
# and network access to the npm registry. Takes well under a minute.
#
# Usage: forensics/report/vendor/build_plotly.sh
set -euo pipefail

PLOTLY_VERSION=4.1.1
PLOTLY_INTEGRITY='sha512-fYLAOj091/+M4h1rmtVIkRIpdkz5/P9IdNUeB9wKmCUyvewuUdlCYR5ryqDWP7Cb36Dn4EvSrs6YKvRJ9ukNdQ=='
TRACES='scatter, heatmap'

# Exact versions: the build tools (plotly.js 4.1.1 devDependencies ranges) and every package that
# ends up in the bundle (esbuild metafile), including transitive ones, so nothing floats.
BUILD_PINS=(
    esbuild@0.28.2
    esbuild-plugin-environment@0.5.0
    esbuild-plugin-define@0.6.0
    esbuild-plugin-glsl@1.4.2
    esbuild-plugin-inline-css@0.0.1
    sha256@0.2.0
)
BUNDLE_PINS=(
    @plotly/d3@3.8.2
    base64-arraybuffer@1.0.2
    culori@4.0.2
    d3-format@1.4.5
    d3-time@1.1.0
    d3-time-format@2.3.0
    events@3.3.0
    fast-isnumeric@1.1.4
    gl-mat4@1.2.0
    has-hover@1.0.1
    has-passive-events@1.0.0
    is-browser@2.1.0
    is-mobile@5.0.0
    is-string-blank@1.0.1
    maplibre-gl@6.9.0
    mouse-event-offset@3.0.2
    native-promise-only@0.8.1
    parse-svg-path@0.2.0
    point-in-polygon@1.1.0
    polybooljs@1.2.2
)

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAME=plotly-stallscope.min.js
WORK="$(mktemp -d "${TMPDIR:-/tmp}/plotly-stallscope-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
echo "== npm pack plotly.js@$PLOTLY_VERSION"
npm pack "plotly.js@$PLOTLY_VERSION" --json >pack.json
node -e '
const [info] = require("./pack.json");
if (info.integrity !== process.argv[1]) {
    console.error("plotly.js tarball integrity mismatch: " + info.integrity);
    process.exit(1);
}' "$PLOTLY_INTEGRITY"
tar xzf "plotly.js-$PLOTLY_VERSION.tgz"
cd package
grep -q "exports.version = '$PLOTLY_VERSION';" src/version.js

echo "== npm install (pinned)"
# Replace plotly's package.json (its dependency ranges and 50-odd devDependencies) by the pins.
mv package.json package.json.plotly
node -e '
const pins = {};
for (const spec of process.argv.slice(1)) {
    const at = spec.lastIndexOf("@");
    pins[spec.slice(0, at)] = spec.slice(at + 1);
}
const pkg = { name: "plotly-stallscope-build", version: "0.0.0", private: true,
              dependencies: pins, overrides: { ...pins } };
require("fs").writeFileSync("package.json", JSON.stringify(pkg, null, 2) + "\n");
' "${BUILD_PINS[@]}" "${BUNDLE_PINS[@]}"
npm install --ignore-scripts --no-audit --no-fund --no-package-lock --loglevel=error

echo "== build"
# esbuild-config.js requires ./tasks/util/constants.js (not shipped); only pathToRoot is read.
mkdir -p tasks/util
cat >tasks/util/constants.js <<'EOF'
module.exports = { pathToRoot: require('path').join(__dirname, '..', '..') };
EOF

# The entry file, in the form tasks/partial_bundle.mjs generates. core.js already registers
# scatter; it is listed anyway, as CUSTOM_BUNDLE.md recommends (registering twice is a no-op).
cat >lib/index-stallscope.js <<'EOF'
'use strict';

var Plotly = require('./core');

Plotly.register([
    // traces
    require('./scatter'),
    require('./heatmap'),
]);

module.exports = Plotly;
EOF

cat >build-stallscope.js <<'EOF'
'use strict';
const fs = require('fs');
const path = require('path');
const { build } = require('esbuild');
const sha256 = require('sha256');
const { esbuildConfig } = require('./esbuild-config.js');

// tasks/compress_attributes.js: strip attribute meta (descriptions etc.) from the sources.
const WHITESPACE_BEFORE = '\\s*';
const OPTIONAL_COMMA = ',?';
const makeRegex = (regexStr) => new RegExp(WHITESPACE_BEFORE + regexStr + OPTIONAL_COMMA, 'g');
const makeStringRegex = (attr) => makeRegex(attr + ": '.*'");
const makeJoinedArrayRegex = (attr) => makeRegex(attr + ': \\[[\\s\\S]*?\\]' + '\\.join\\([\\s\\S]*?\\)');
const makeArrayRegex = (attr) => makeRegex(attr + ': \\[[\\s\\S]*?\\]');
const allRegexes = [
    makeStringRegex('description'),
    makeJoinedArrayRegex('description'),
    makeArrayRegex('requiredOpts'),
    makeArrayRegex('otherOpts'),
    makeStringRegex('role'),
    makeStringRegex('hrName')
];
const esbuildPluginStripMeta = {
    name: 'strip-meta-attributes',
    setup(b) {
        b.onLoad({ filter: /\.js$/ }, async (file) => ({
            contents: await fs.promises.readFile(file.path, 'utf-8').then((c) => {
                allRegexes.forEach((r) => { c = c.replace(r, ''); });
                return c;
            }),
            loader: 'js'
        }));
    }
};

// esbuild-plugin-inline-css 0.0.1, same generated code, but the style id hashes the CSS path
// relative to the package root instead of the absolute path (which would vary per build dir).
const inlineCssRelative = {
    name: 'esbuild-plugin-inline-css',
    setup(b) {
        b.onLoad({ filter: /\.(css)$/ }, async (args) => {
            const sourcePath = path.resolve(args.resolveDir, args.path);
            const styleID = sha256(path.relative(__dirname, sourcePath).split(path.sep).join('/'));
            const sourceCSS = fs.readFileSync(sourcePath);
            return {
                contents: `(function(){
        if (!document.getElementById('${styleID}')) {
            var e = document.createElement('style');
            e.id = '${styleID}';
            e.textContent = \`${sourceCSS}\`;
            document.head.appendChild(e);
        }
    })();`,
                loader: 'js'
            };
        });
    }
};

const [entry, outfile] = process.argv.slice(2);
(async () => {
    // tasks/util/bundle_wrapper.mjs with opts.minify (the min bundle of tasks/partial_bundle.mjs)
    const config = { ...esbuildConfig };
    config.entryPoints = [entry];
    config.outfile = outfile;
    config.minify = true;
    const plugins = esbuildConfig.plugins.map((p) => (p.name === inlineCssRelative.name ? inlineCssRelative : p));
    if (plugins.indexOf(inlineCssRelative) === -1) throw new Error('esbuild-plugin-inline-css not in esbuild-config.js');
    config.plugins = plugins.concat([esbuildPluginStripMeta]);
    await build(config);

    const wrapped = [
        '(',
        ' function(root, factory) {',
        '  if (typeof module === "object" && module.exports) {',
        '   module.exports = factory();',
        '  } else {',
        '   root.moduleName = factory();',
        '  }',
        '} (typeof self !== "undefined" ? self : this, () => {',
        ''
    ].join('\n') + fs.readFileSync(outfile, 'utf-8') + [
        '',
        'window.Plotly = Plotly;',
        'return Plotly;',
        '}));',
    ].join('\n');
    fs.writeFileSync(outfile, wrapped);
    const css = outfile.replace(/\.js$/, '.css');
    if (fs.existsSync(css)) fs.unlinkSync(css);
})().catch((err) => { console.error(err); process.exit(1); });
EOF
node build-stallscope.js lib/index-stallscope.js "$WORK/body.min.js"

# Header in the style of plotly's dist banners (tasks/partial_bundle.mjs + constants.licenseDist).
COPYRIGHT="$(sed -n '3p' dist/plotly.min.js)"
case "$COPYRIGHT" in '* Copyright '*) ;; *) echo "unexpected dist banner: $COPYRIGHT" >&2; exit 1 ;; esac
{
    printf '/**\n'
    printf '* plotly.js (stallscope - minified) v%s\n' "$PLOTLY_VERSION"
    printf '%s\n' "$COPYRIGHT"
    printf '* All rights reserved.\n'
    printf '* Licensed under the MIT license\n'
    printf '*\n'
    printf '* Partial bundle, traces: %s. Built by forensics/report/vendor/build_plotly.sh\n' "$TRACES"
    printf '* from the plotly.js@%s npm package; license text in PLOTLY_LICENSE.\n' "$PLOTLY_VERSION"
    printf '*/\n'
    cat "$WORK/body.min.js"
} >"$WORK/$NAME"
grep -q "\.version=\"$PLOTLY_VERSION\"" "$WORK/$NAME"

echo "== write $HERE"
cp "$WORK/$NAME" "$HERE/$NAME"
cp LICENSE "$HERE/PLOTLY_LICENSE"
OLD=""
[ -f "$HERE/$NAME.sha256" ] && OLD="$(cat "$HERE/$NAME.sha256")"
(cd "$HERE" && sha256sum "$NAME" >"$NAME.sha256")
NEW="$(cat "$HERE/$NAME.sha256")"
echo "$NEW ($(wc -c <"$HERE/$NAME") bytes)"
if [ -n "$OLD" ] && [ "$OLD" != "$NEW" ]; then
    echo "note: the bundle differs from the previously recorded one: $OLD" >&2
fi
