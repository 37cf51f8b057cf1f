// A module whose default export is neither a function nor `{ transaction }`.
export default { run: async () => 'not a handler' };
