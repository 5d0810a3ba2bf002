import { defineConfig } from 'vitest/config';

// Unit tests of the plain TypeScript modules; the panel test runs its DOM in jsdom.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node',
    setupFiles: ['test/setup-dom.ts']
  }
});
